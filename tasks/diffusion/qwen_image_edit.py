"""The Qwen-Image-Edit family (`QwenImageEditPipeline`): instruction-based image editing on
Qwen-Image's transformer, VAE and text encoder (`qwen_image.py`: packing, shift, true CFG). Each
prompt row brings a source image (`policy.image_column`), resized to `source_area` pixels at its
own aspect ratio (the pipeline's `calculate_dimensions`, 1024 x 1024 unless `policy.source_area`
says). The source conditions every step twice, as in the stock pipeline: the Qwen2.5-VL text
encoder reads it with the instruction (the prompt and the empty negative prompt alike), and its
VAE latents, packed into tokens, are appended to the noisy latents' tokens, whose prediction alone
is kept."""

from __future__ import annotations

import torch
from torch import Tensor

from .family import FAMILIES
from .qwen_image import QwenImage

PIPELINE_AREA = 1024 * 1024  # the stock pipeline's source area (its __call__'s calculate_dimensions)


@FAMILIES.register("qwen_image_edit")
class QwenImageEdit(QwenImage):
    pipeline = "QwenImageEditPipeline"
    conditioning_image = True

    def __init__(self, pipe, size, num_frames=1):
        super().__init__(pipe, size, num_frames)
        self.source_area = PIPELINE_AREA

    def set_source_area(self, area):
        if area < 32 * 32:
            raise ValueError(f"policy.source_area={area}: a source image needs at least 32 x 32 pixels")
        self.source_area = area

    def source_size(self, image) -> tuple[int, int]:
        """(height, width) of `image` (PIL) once resized as the stock pipeline does."""
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit
        width, height, _ = pipeline_qwenimage_edit.calculate_dimensions(self.source_area, image.width / image.height)
        return height, width

    def condition(self, prompts, images, guided):
        rows = [self._row_condition(p, image, guided) for p, image in zip(prompts, images)]
        grids = {tuple(r["pos/source_grid"][0].tolist()) for r in rows}
        if len(grids) > 1:
            raise ValueError(f"{type(self).__name__}: the source images of one batch resize to different latent "
                             f"grids {sorted(grids)} (different aspect ratios); give every source one aspect ratio")
        return {key: torch.cat([r[key] for r in rows]) for key in rows[0]}

    def _row_condition(self, prompt: str, image, guided: bool) -> dict[str, Tensor]:
        """One row's conditioning: its text read with the source image, the source's packed latents
        [1, S, 4 C] and their grid (rows, columns) of packed tokens."""
        pipe = self.pipe
        height, width = self.source_size(image)
        shown = pipe.image_processor.resize(image, height, width)
        out = {}
        for side, text in (("pos", prompt), ("neg", "" if guided else None)):
            if text is not None:
                out[f"{side}/embeds"], out[f"{side}/mask"] = self._text([text], self._text_positions(shown),
                                                                        image=[shown])
        pixels = pipe.image_processor.preprocess(shown, height, width).unsqueeze(2)
        z = pipe._encode_vae_image(pixels.to(self.device, pipe.vae.dtype), generator=None)
        out["pos/source"] = pipe._pack_latents(z, 1, z.shape[1], z.shape[3], z.shape[4]).to(self.dtype)
        out["pos/source_grid"] = torch.tensor([[z.shape[3] // 2, z.shape[4] // 2]])
        return out

    def _text_positions(self, shown) -> int:
        """What a row's text conditioning is padded to: `text_length` positions for the instruction
        and the template past its first 64 tokens, plus the source image's vision tokens as the
        processor cuts them (about 1,340 for a 1024 x 1024 source), alike for every source of
        one size, so that rows drawn apart join."""
        processor = self.pipe.processor.image_processor
        grid = processor(images=[shown], return_tensors="pt")["image_grid_thw"]
        return self.text_length + int(grid.prod()) // processor.merge_size ** 2

    def _image_tokens(self, x, pos):
        hidden, shapes = super()._image_tokens(x, pos)
        rows, columns = (int(v) for v in pos["source_grid"][0])
        return torch.cat([hidden, pos["source"].to(hidden.dtype)], dim=1), shapes + [(1, rows, columns)]
