"""Pixel-space flow-matching text-to-image pipelines for CPU demos: RGB pixels in [-1, 1] (no
VAE), FlowMatchEulerDiscreteScheduler, a CLIP text encoder, and as the denoiser an SD3 MMDiT
(token states and the pooled projection; `PixelFlowPipeline`) or a UNet that cross-attends to the
token states (`PixelFlowUNetPipeline`, the t2i demo's); and for video the same UNet over a clip's
frames stacked on the channel axis (`PixelFlowVideoPipeline`, the t2v demo's); and for
instruction-based editing the UNet with the source image's pixels concatenated to the noisy ones
on the channel axis (`PixelFlowEditPipeline`, the edit demo's). Each is a `DiffusionPipeline`, so it saves, loads
and moves like any diffusers pipeline; diffusers does not know the class, so a saved one loads with
`PixelFlowPipeline.from_pretrained(path)` (or `PixelFlowUNetPipeline`), and `policy.model: path`
finds the class through the loaders `tasks.demos` registers in
`tasks.diffusion.loading.PIPELINE_LOADERS`. (Imported on first use: diffusers is slow to import.)"""

from __future__ import annotations

import torch
from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, UNet2DConditionModel

from ..diffusion.families import SD3, SD15
from ..diffusion.family import FAMILIES


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


class UNetComponents(DiffusionPipeline):
    """The components of the pixel UNet pipelines below (siblings, not one the other's subclass:
    a family is found by `isinstance` on its pipeline class)."""

    def __init__(self, unet: UNet2DConditionModel, scheduler: FlowMatchEulerDiscreteScheduler, text_encoder,
                 tokenizer):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler, text_encoder=text_encoder, tokenizer=tokenizer)


class PixelFlowUNetPipeline(UNetComponents):
    """The same pixel-space flow model with a convolutional denoiser: a UNet2DConditionModel that
    cross-attends to the text encoder's token states."""


@FAMILIES.register("pixel_flow_unet")
class PixelFlowUNet(PixelFlow):
    """PixelFlow with a UNet denoiser (no patches, no pooled projection): the denoiser and its call
    are SD 1.5's (a UNet2DConditionModel on the text's token states), the steps are flow matching's."""

    pipeline = "PixelFlowUNetPipeline"
    denoiser = SD15.denoiser
    predict = SD15.predict


class PixelFlowVideoPipeline(UNetComponents):
    """The pixel UNet flow model for clips: the UNet sees a clip's T frames stacked on the channel
    axis (in and out channels 3 T), so its first convolution mixes the frames (the temporal mixing)
    and every later layer sees them all."""


@FAMILIES.register("pixel_flow_video")
class PixelFlowVideo(PixelFlowUNet):
    """Video latents are the clip's pixels [B, 3, T, H, W] in [-1, 1]; the denoiser is called on
    them reshaped to [B, 3 T, H, W]. A completion is its list of T PIL frames."""

    pipeline = "PixelFlowVideoPipeline"
    output = "video"
    fps = 8  # the t2v demo's clips (tasks/demos/synthetic/moving_shapes.py)

    def __init__(self, pipe, size, num_frames=1):
        super().__init__(pipe, size, num_frames)
        channels = pipe.unet.config.in_channels
        if channels != 3 * num_frames:
            raise ValueError(f"policy.num_frames={num_frames}: this PixelFlowVideoPipeline draws "
                             f"{channels // 3} frames (its UNet takes {channels} = 3 x frames channels)")

    def noise(self, generator, height, width):
        return torch.randn((1, 3, self.num_frames, height, width), generator=generator, dtype=torch.float32)

    def predict(self, model, x, t, cond, guidance_scale, guided):
        b, c, f, h, w = x.shape
        flat = x.transpose(1, 2).reshape(b, f * c, h, w)
        pred = super().predict(model, flat, t, cond, guidance_scale, guided)
        return pred.reshape(b, f, c, h, w).transpose(1, 2)

    def decode(self, latents, height, width):
        frames = latents.transpose(1, 2).flatten(0, 1)  # [B T, 3, H, W]
        images = super().decode(frames, height, width)
        t = latents.shape[2]
        return [images[i:i + t] for i in range(0, len(images), t)]


class PixelFlowEditPipeline(UNetComponents):
    """The pixel UNet flow model for instruction-based editing: the UNet takes 6 channels, the
    noisy image's 3 then the source image's 3 (InstructPix2Pix's conditioning by concatenation),
    and cross-attends to the instruction; it predicts the edit's 3."""


@FAMILIES.register("pixel_flow_edit")
class PixelFlowEdit(PixelFlowUNet):
    """Each prompt row brings its source image (`policy.image_column`), read at the drawn size
    into [-1, 1] and kept as ``pos/source`` [B, 3, H, W]; every denoiser call sees it beside the
    noisy pixels (both guidance passes: the unconditional one drops only the text)."""

    pipeline = "PixelFlowEditPipeline"
    conditioning_image = True

    def __init__(self, pipe, size, num_frames=1):
        super().__init__(pipe, size, num_frames)
        channels = pipe.unet.config.in_channels
        if channels != 6:
            raise ValueError(f"{type(pipe).__name__}: its UNet takes {channels} channels, not 6 (noisy image + source)")

    def image_condition(self, images):
        from ..diffusion.warm_start import target_pixels
        height, width = self.size
        pixels = [target_pixels(image, f"source image {i}", height, width) for i, image in enumerate(images)]
        return {"pos/source": torch.stack(pixels).to(self.device, self.dtype)}

    def predict(self, model, x, t, cond, guidance_scale, guided):
        source = cond["pos/source"].to(x.device, x.dtype)
        return super().predict(model, torch.cat([x, source], 1), t, cond, guidance_scale, guided)
