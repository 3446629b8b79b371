"""A pixel-space flow-matching text-to-image pipeline for the CPU demo: an SD3 MMDiT over RGB
pixels in [-1, 1] (no VAE), conditioned on a CLIP text encoder (token states and the pooled
projection), FlowMatchEulerDiscreteScheduler. It is a `DiffusionPipeline`, so it saves, loads
and moves like any diffusers pipeline. (Imported on first use: diffusers is slow to import.)"""

from __future__ import annotations

import torch
from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

from .families import FAMILIES, SD3


class PixelFlowPipeline(DiffusionPipeline):
    def __init__(self, transformer: SD3Transformer2DModel, scheduler: FlowMatchEulerDiscreteScheduler,
                 text_encoder, tokenizer):
        super().__init__()
        self.register_modules(transformer=transformer, scheduler=scheduler, text_encoder=text_encoder,
                              tokenizer=tokenizer)


@FAMILIES.register("pixel_flow")
class PixelFlow(SD3):
    """SD3's conditioning and steps; latents are the pixels themselves."""

    pipeline = "PixelFlowPipeline"

    def encode(self, prompts, guided):
        def embed(texts):
            ids = self.pipe.tokenizer(texts, padding="max_length", max_length=self.pipe.tokenizer.model_max_length,
                                      truncation=True, return_tensors="pt").input_ids.to(self.device)
            out = self.pipe.text_encoder(ids, output_hidden_states=True)
            return out.hidden_states[-1], out.text_embeds
        pe, pooled = embed(prompts)
        result = {"pos/embeds": pe, "pos/pooled": pooled}
        if guided:
            npe, npooled = embed([""] * len(prompts))
            result.update({"neg/embeds": npe, "neg/pooled": npooled})
        return result

    def noise(self, generator, height, width):
        return torch.randn((1, 3, height, width), generator=generator, dtype=torch.float32)

    def image_latents(self, pixels):
        return pixels

    def decode(self, latents, height, width):
        from PIL import Image
        arr = ((latents.float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()
        return [Image.fromarray(a) for a in arr]
