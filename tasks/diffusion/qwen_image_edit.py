"""The Qwen-Image-Edit families (`QwenImageEditPipeline`, and `QwenImageEditPlusPipeline` with one
source or several per row): instruction-based image editing on
Qwen-Image's transformer, VAE and text encoder (`qwen_image.py`: packing, shift, true CFG). Each
prompt row's source image (`editing.py`) is resized to `source_area` pixels at its own aspect
ratio (the pipeline's `calculate_dimensions`, 1024 x 1024 unless `policy.source_area` says) and
conditions every step twice, as in the stock pipeline: the Qwen2.5-VL text encoder reads it with
the instruction (the prompt and the empty negative prompt alike), and its VAE latents, packed into
tokens, follow the noisy latents' tokens."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .editing import SourceImage, source_grids
from .family import FAMILIES
from .qwen_image import QwenImage

PIPELINE_AREA = 1024 * 1024  # the stock pipeline's source area (its __call__'s calculate_dimensions)


@FAMILIES.register("qwen_image_edit")
class QwenImageEdit(SourceImage, QwenImage):
    pipeline = "QwenImageEditPipeline"

    def source_size(self, image) -> tuple[int, int]:
        """(height, width) of `image` (PIL) once resized as the stock pipeline does."""
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit
        return self._sized(pipeline_qwenimage_edit.calculate_dimensions, self.source_area or PIPELINE_AREA, image)

    @staticmethod
    def _sized(dimensions, area: int, image) -> tuple[int, int]:
        """(height, width) of `image` resized to `area` by the pipeline's `dimensions(area, ratio)`."""
        width, height = dimensions(area, image.width / image.height)[:2]
        if not height or not width:
            raise ValueError(f"policy.source_area={area}: a {image.width} x {image.height} source resizes to "
                             f"{width} x {height} pixels (sides rounded to 32); give a larger area")
        return height, width

    def condition(self, prompts, images, guided):
        return self.joined([self._row_condition(p, image, guided) for p, image in zip(prompts, images)])

    def _views(self, image) -> tuple[Any, Tensor]:
        """(the source as the text encoder sees it, its pixels [1, 3, 1, H, W] for the VAE): both at
        the resized source's size."""
        height, width = self.source_size(image)
        shown = self.pipe.image_processor.resize(image, height, width)
        return shown, self.pipe.image_processor.preprocess(shown, height, width).unsqueeze(2)

    def _row_condition(self, prompt: str, images, guided: bool) -> dict[str, Tensor]:
        """One row's conditioning: its text read with its source images (one, or a list in order),
        the sources' tokens."""
        pipe = self.pipe
        shown, pixels = zip(*(self._views(image) for image in (images if isinstance(images, list) else [images])))
        out = {}
        for side, text in (("pos", prompt), ("neg", "" if guided else None)):
            if text is not None:
                out[f"{side}/embeds"], out[f"{side}/mask"] = self._text([text], self._text_positions(list(shown)),
                                                                        image=list(shown))
        latents = [pipe._encode_vae_image(p.to(self.device, pipe.vae.dtype), generator=None) for p in pixels]
        return {**out, **self.source_tokens(latents)}

    def _text_positions(self, shown: list) -> int:
        """What a row's text conditioning is padded to: `text_length` positions for the instruction
        and the template past its first 64 tokens, plus the source images' vision tokens as the
        processor cuts them (about 1,340 for a 1024 x 1024 source), alike for every row of the
        same sources' sizes, so that rows drawn apart join."""
        processor = self.pipe.processor.image_processor
        grid = processor(images=shown, return_tensors="pt")["image_grid_thw"]
        return self.text_length + int(grid.prod(-1).sum()) // processor.merge_size ** 2

    def _image_tokens(self, x, pos):
        hidden, shapes = super()._image_tokens(x, pos)
        sources = [(1, *grid) for grid in source_grids(pos)]
        return torch.cat([hidden, pos["source"].to(hidden.dtype)], dim=1), shapes + sources


@FAMILIES.register("qwen_image_edit_plus")
class QwenImageEditPlus(QwenImageEdit):
    """Qwen-Image-Edit-Plus (`QwenImageEditPlusPipeline`, Qwen-Image-Edit-2509 / 2511), one source or
    a list per row (`policy.image_column`): the text encoder reads each source at the pipeline's
    condition area (384 x 384, its `CONDITION_IMAGE_SIZE`) after "Picture k: ", the VAE encodes each
    at `source_area` (its `VAE_IMAGE_SIZE`, 1024 x 1024, unless `policy.source_area` says), and the
    sources' tokens follow the noisy latents' in the list's order, as the stock call's `image` list."""

    pipeline = "QwenImageEditPlusPipeline"
    most_conditioning_images = None

    def source_size(self, image):
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus
        return self._sized(plus.calculate_dimensions, self.source_area or plus.VAE_IMAGE_SIZE, image)

    def _views(self, image):
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus
        height, width = self._sized(plus.calculate_dimensions, plus.CONDITION_IMAGE_SIZE, image)
        vae_height, vae_width = self.source_size(image)
        return (self.pipe.image_processor.resize(image, height, width),
                self.pipe.image_processor.preprocess(image, vae_height, vae_width).unsqueeze(2))
