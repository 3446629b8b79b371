"""What the instruction-based image-editing families share (`qwen_image_edit.py`,
`flux_kontext.py`): each prompt row brings a source image (`policy.image_column`), resized as the
family's stock pipeline resizes it or to `policy.source_area` pixels, encoded by the VAE and
packed into tokens that the transformer reads after the noisy latents' tokens at every step; only
the noisy tokens' prediction is kept. A family that reads several sources a row (Edit-Plus: a list
in the column) appends each one's tokens in the list's order. The rows of one batch share their
sources' count and latent grids."""

from __future__ import annotations

import torch
from torch import Tensor

from .family import Cond

SMALLEST_AREA = 32 * 32  # a source's least area: one 2x2-packed token of a 16x VAE


class SourceImage:
    """The source-image conditioning of an editing family (a mixin before its `Family` base)."""

    conditioning_image = True
    source_area: int | None = None  # pixels of a resized source; None: as the stock pipeline resizes it

    def set_source_area(self, area: int) -> None:
        if area < SMALLEST_AREA:
            raise ValueError(f"policy.source_area={area}: a source image needs at least 32 x 32 pixels")
        self.source_area = area

    def source_tokens(self, latents: list[Tensor]) -> dict[str, Tensor]:
        """The packed tokens [1, S, 4 C] of a row's sources' VAE latents (each [1, C, (1,) h, w]), in
        order, and their grids [1, 2 x sources] (rows, columns of packed tokens, source after
        source), under `pos/`: both guidance passes read them."""
        tokens, grid = [], []
        for z in latents:
            h, w = z.shape[-2:]
            tokens.append(self.pipe._pack_latents(z, 1, z.shape[1], h, w).to(self.dtype))
            grid += [h // 2, w // 2]
        return {"pos/source": torch.cat(tokens, dim=1), "pos/source_grid": torch.tensor([grid])}

    def joined(self, rows: list[Cond]) -> Cond:
        """The rows' conditionings as one batch, refused where their sources' grids differ."""
        grids = {tuple(r["pos/source_grid"][0].tolist()) for r in rows}
        if len(grids) > 1:
            raise ValueError(f"{type(self).__name__}: the source images of one batch resize to different latent "
                             f"grids {sorted(grids)} (rows, columns of each source: different aspect ratios or "
                             "counts of sources); give every row's sources one aspect ratio and count")
        return {key: torch.cat([r[key] for r in rows]) for key in rows[0]}


def source_grids(pos: Cond) -> list[tuple[int, int]]:
    """(rows, columns) of each source's packed tokens in a batch's conditioning, in order."""
    values = [int(v) for v in pos["source_grid"][0]]
    return list(zip(values[::2], values[1::2]))
