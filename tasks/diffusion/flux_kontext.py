"""The FLUX.1 Kontext family (`FluxKontextPipeline`): instruction-based image editing on FLUX.1's
transformer, VAE and text encoders (`families.py`: packing, shift, the guidance embedding, true CFG).
Each prompt row's source image (`editing.py`) is resized as the stock pipeline does by default
(`_auto_resize`: the Kontext resolution of the nearest aspect ratio, about 1024 x 1024) or, with
`policy.source_area`, to that many pixels at its own aspect ratio (the stock pipeline's sizing of
its output to `max_area`; the stock call reproduces it with `_auto_resize=False` and the source
given at that size). Its VAE latents, packed into tokens whose position ids carry 1 in their first
axis (the noisy latents' carry 0), follow the noisy latents' tokens at every step, in both forwards of true CFG (the stock call's)."""

from __future__ import annotations

import torch

from .editing import SourceImage, source_grids
from .families import Flux
from .family import FAMILIES


@FAMILIES.register("flux_kontext")
class FluxKontext(SourceImage, Flux):
    pipeline = "FluxKontextPipeline"

    def source_size(self, image) -> tuple[int, int]:
        """(height, width) of `image` (PIL) once resized (the stock pipeline's rounding to 2x2-packed latents)."""
        from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS
        ratio = image.width / image.height
        if self.source_area is None:
            _, width, height = min((abs(ratio - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
        else:
            width, height = round((self.source_area * ratio) ** 0.5), round((self.source_area / ratio) ** 0.5)
        multiple = self.pipe.vae_scale_factor * 2
        return height // multiple * multiple, width // multiple * multiple

    def image_condition(self, images):
        pipe, rows = self.pipe, []
        for image in images:
            height, width = self.source_size(image)
            pixels = pipe.image_processor.preprocess(pipe.image_processor.resize(image, height, width), height, width)
            rows.append(self.source_tokens([pipe._encode_vae_image(pixels.to(self.device, pipe.vae.dtype), None)]))
        return self.joined(rows)

    def _image_tokens(self, x, pos):
        hidden, ids = super()._image_tokens(x, pos)
        source_ids = self.pipe._prepare_latent_image_ids(1, *source_grids(pos)[0], x.device, self.dtype)
        source_ids[..., 0] = 1
        return torch.cat([hidden, pos["source"].to(hidden.dtype)], dim=1), torch.cat([ids, source_ids])
