"""Consistency of an image edit with its source outside the edited region (`edit_consistency`),
in [0, 1]: one minus the mean absolute pixel difference (RGB in [0, 1], averaged over channels)
between the edit and the source, over the pixels the instruction should leave alone.

Which pixels those are: where the row has a `mask` column (an image, or a path: nonzero pixels
mark the region the edit may change), every pixel outside it; otherwise the edit is allowed to
change a `region` share of the image for free: the `region` share of pixels it changed most is
left out and the rest count,

    with mask:     1 - mean_{p outside mask} d(p)
    without:       1 - mean of the (1 - region) N smallest d(p)     (N pixels)
    d(p) = mean_c |edit(p, c) - source(p, c)|

The source (and the mask) are resized to the edit's size first (bilinear; the mask nearest). An
edit that copies the source scores 1 whatever its instruction: pair this reward with one that
scores the instruction (`clip_direction`, `edit_judge`, a task's own)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mmrl.core.scoring import register_reward

from .outputs import IMAGE


def source_image(value: Any):
    """A row's source image (a PIL image or a path) as RGB."""
    from PIL import Image
    if isinstance(value, Image.Image):
        return value.convert("RGB")
    with Image.open(value) as image:
        return image.convert("RGB")


def pixel_change(edit, source) -> np.ndarray:
    """d [H, W]: the mean over RGB of |edit - source| in [0, 1], the source resized to the edit's size."""
    from PIL import Image
    edit = edit.convert("RGB")
    source = source.resize(edit.size, Image.BILINEAR)
    return np.abs(np.asarray(edit, np.float64) - np.asarray(source, np.float64)).mean(-1) / 255.0


def consistency(change: np.ndarray, keep: np.ndarray | None, region: float) -> float:
    """1 - the mean change over the `keep` pixels (bool [H, W]), or over all but the `region` share
    that changed most when no mask is given."""
    if keep is not None:
        return 1.0 - float(change[keep].mean()) if keep.any() else 1.0
    flat = np.sort(change.ravel())
    kept = flat[:int(round(len(flat) * (1.0 - region)))]
    return 1.0 - float(kept.mean()) if len(kept) else 1.0


@register_reward("edit_consistency", outputs=IMAGE)
def edit_consistency(prompts, completions, image: Sequence, mask: Sequence | None = None, region: float = 0.25,
                     **columns):
    if not 0.0 <= region < 1.0:
        raise ValueError(f"edit_consistency: region={region} must be in [0, 1)")
    from PIL import Image
    out = []
    for i, edit in enumerate(completions):
        change = pixel_change(edit, source_image(image[i]))
        keep = None
        if mask is not None and mask[i] is not None:
            drawn = source_image(mask[i]).convert("L").resize(change.shape[::-1], Image.NEAREST)
            keep = np.asarray(drawn) == 0
        out.append(consistency(change, keep, region))
    return out
