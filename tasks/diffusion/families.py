"""What differs between diffusers pipeline families, behind one small interface: prompt
conditioning, the initial noise's shape, the step levels and model timesteps, one denoiser call
(with classifier-free guidance), decoding to PIL images.

    SD3 / SD3.5  StableDiffusion3Pipeline, FlowMatchEulerDiscreteScheduler: flow matching, CFG
    FLUX.1       FluxPipeline: flow matching on packed 2x2 latents, guidance as an embedding
    SD 1.5       StableDiffusionPipeline with DDIMScheduler: eps prediction, CFG
    Wan 2.1/2.2  WanPipeline (text-to-video), WanImageToVideoPipeline (the conditioning image's latents
                 and mask concatenated to the noisy latents, its CLIP embedding): flow matching on 5-D
                 video latents [B, C, F, H, W], CFG as two denoiser calls as the pipelines make them
    HunyuanVideo HunyuanVideoPipeline: flow matching on video latents, guidance as an embedding
A video is a list of PIL frames. Levels are sigmas s (flow) or cumulative alphas ab (eps models); `levels[k] -> levels[k + 1]` is
step k. Everything here runs the pipeline's own scheduler and encoders, so the ODE path equals
the stock pipeline's output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from mmrl.registry import Registry

Cond = dict[str, Tensor]
FAMILIES: Registry[type] = Registry("diffusion pipeline family")


class Family:
    """One pipeline family; `denoiser` is the module RL trains. A subclass registers in FAMILIES
    and names the diffusers pipeline class it serves in `pipeline` (by name, so that diffusers is
    imported only when a pipeline is loaded); `family_of` picks the family of a loaded pipeline."""

    pipeline = ""  # the pipeline class (or a base class) of the pipelines this family serves
    kind = "flow"  # "flow": the model predicts v;  "eps": it predicts the noise
    uses_classifier_free_guidance = True
    batched_guidance = True  # CFG as one call on [uncond, cond] (False: two calls, as the video pipelines)
    conditioning_image = False  # the prompt comes with an image (`image_condition`)
    fps: int | None = None  # a video family's frames per second (its rows' `fps` column); None: images

    def __init__(self, pipe, size: tuple[int, int], num_frames: int = 1):
        self.pipe = pipe
        self.size = size  # image (height, width)
        self.num_frames = num_frames  # frames of a video (video families)

    @property
    def denoiser(self) -> nn.Module:
        return self.pipe.transformer

    def encode(self, prompts: list[str], guided: bool) -> Cond:
        raise NotImplementedError

    def image_condition(self, images: list) -> Cond:
        """Conditioning from one image per prompt (image-to-video families), under `pos/` keys: both
        classifier-free guidance passes read it."""
        raise NotImplementedError

    def noise(self, generator: torch.Generator, height: int, width: int) -> Tensor:
        raise NotImplementedError

    def levels(self, num_steps: int, latent_shape: tuple[int, ...]) -> tuple[list[float], Tensor]:
        raise NotImplementedError

    def predict(self, model: nn.Module, x: Tensor, t: Tensor, cond: Cond, guidance_scale: float,
                guided: bool) -> Tensor:
        raise NotImplementedError

    def decode(self, latents: Tensor, height: int, width: int) -> list:
        raise NotImplementedError

    def image_latents(self, pixels: Tensor) -> Tensor:
        """Latents [B, ...] of images [B, 3, H, W] in [-1, 1] (the VAE's mean, scaled)."""
        vae = self.pipe.vae
        z = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist.mean
        return ((z - (vae.config.shift_factor or 0.0)) * vae.config.scaling_factor).float()

    # ----- shared helpers
    @property
    def dtype(self) -> torch.dtype:
        return self.denoiser.dtype

    @property
    def device(self) -> torch.device:
        return next(self.denoiser.parameters()).device

    def _guided(self, run, x: Tensor, cond_pos: dict, cond_neg: dict | None, guidance_scale: float) -> Tensor:
        """CFG as the pipelines do it: one batched call on [uncond, cond], u + g (c - u)."""
        if cond_neg is None:
            return run(x, cond_pos)
        if not self.batched_guidance:
            text = run(x, cond_pos)
            uncond = run(x, cond_neg)
            return uncond + guidance_scale * (text - uncond)
        joint = {k: torch.cat([cond_neg[k], cond_pos[k]]) for k in cond_pos}
        uncond, text = run(torch.cat([x, x]), joint).chunk(2)
        return uncond + guidance_scale * (text - uncond)

    def _vae_image(self, latents: Tensor) -> list:
        vae = self.pipe.vae
        scaled = latents / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        image = vae.decode(scaled.to(vae.dtype), return_dict=False)[0]
        return self.pipe.image_processor.postprocess(image, output_type="pil")


def _split(cond: Cond) -> tuple[dict, dict | None]:
    pos = {k[4:]: v for k, v in cond.items() if k.startswith("pos/")}
    neg = {k[4:]: v for k, v in cond.items() if k.startswith("neg/")}
    return pos, (neg or None)


def _flow_shift_mu(pipe, image_seq_len: int) -> float | None:
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift
    c = pipe.scheduler.config
    if not c.get("use_dynamic_shifting", False):
        return None
    return calculate_shift(image_seq_len, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                           c.get("base_shift", 0.5), c.get("max_shift", 1.15))


@FAMILIES.register("sd3")
class SD3(Family):
    pipeline = "StableDiffusion3Pipeline"
    def encode(self, prompts, guided):
        pe, npe, pooled, npooled = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, negative_prompt=[""] * len(prompts) if guided else None,
            do_classifier_free_guidance=guided, device=self.device, num_images_per_prompt=1)
        out = {"pos/embeds": pe, "pos/pooled": pooled}
        if guided:
            out.update({"neg/embeds": npe, "neg/pooled": npooled})
        return out

    def noise(self, generator, height, width):
        f = self.pipe.vae_scale_factor
        c = self.denoiser.config.in_channels
        return torch.randn((1, c, height // f, width // f), generator=generator, dtype=torch.float32)

    def levels(self, num_steps, latent_shape):
        p = self.denoiser.config.get("patch_size", 1)  # a UNet denoiser (pixel_flow_unet) has no patches
        mu = _flow_shift_mu(self.pipe, (latent_shape[-2] // p) * (latent_shape[-1] // p))
        self.pipe.scheduler.set_timesteps(num_steps, device="cpu", **({"mu": mu} if mu is not None else {}))
        return self.pipe.scheduler.sigmas.tolist(), self.pipe.scheduler.timesteps.clone()

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = _split(cond)

        def run(h, c):
            return model(hidden_states=h.to(self.dtype), timestep=t.expand(h.shape[0]).to(h.device),
                         encoder_hidden_states=c["embeds"], pooled_projections=c["pooled"], return_dict=False)[0]
        return self._guided(run, x, pos, neg if guided else None, guidance_scale)

    def decode(self, latents, height, width):
        return self._vae_image(latents)


@FAMILIES.register("flux")
class Flux(Family):
    pipeline = "FluxPipeline"
    uses_classifier_free_guidance = False  # FLUX.1-dev is guidance-distilled: the scale enters as an embedding

    def encode(self, prompts, guided):
        if guided:
            raise ValueError("FLUX takes the guidance scale as an embedding: set policy.classifier_free_guidance=false")
        pe, pooled, _ = self.pipe.encode_prompt(prompt=prompts, prompt_2=None, device=self.device,
                                                num_images_per_prompt=1)
        return {"pos/embeds": pe, "pos/pooled": pooled}

    def _latent_hw(self, height, width):
        f = self.pipe.vae_scale_factor
        return 2 * (height // (f * 2)), 2 * (width // (f * 2))

    def noise(self, generator, height, width):
        h, w = self._latent_hw(height, width)
        c = self.denoiser.config.in_channels // 4
        x = torch.randn((1, c, h, w), generator=generator, dtype=torch.float32)
        return self.pipe._pack_latents(x, 1, c, h, w)

    def levels(self, num_steps, latent_shape):
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        mu = _flow_shift_mu(self.pipe, latent_shape[-2])
        self.pipe.scheduler.set_timesteps(sigmas=sigmas, device="cpu", **({"mu": mu} if mu is not None else {}))
        return self.pipe.scheduler.sigmas.tolist(), self.pipe.scheduler.timesteps.clone()

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, _ = _split(cond)
        n = x.shape[0]
        h, w = (d // 2 for d in self._latent_hw(*self.size))
        img_ids = self.pipe._prepare_latent_image_ids(n, h, w, x.device, self.dtype)
        txt_ids = torch.zeros(pos["embeds"].shape[1], 3, device=x.device, dtype=self.dtype)
        guidance = (torch.full((n,), guidance_scale, device=x.device, dtype=torch.float32)
                    if self.denoiser.config.guidance_embeds else None)
        return model(hidden_states=x.to(self.dtype), timestep=(t.expand(n).to(x.device, self.dtype) / 1000),
                     guidance=guidance, pooled_projections=pos["pooled"], encoder_hidden_states=pos["embeds"],
                     txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]

    def decode(self, latents, height, width):
        f = self.pipe.vae_scale_factor
        return self._vae_image(self.pipe._unpack_latents(latents, height, width, f))

    def image_latents(self, pixels):
        z = super().image_latents(pixels)
        return self.pipe._pack_latents(z, z.shape[0], z.shape[1], z.shape[2], z.shape[3])


@FAMILIES.register("sd15")
class SD15(Family):
    pipeline = "StableDiffusionPipeline"
    kind = "eps"

    @property
    def denoiser(self):
        return self.pipe.unet

    def encode(self, prompts, guided):
        pe, npe = self.pipe.encode_prompt(prompts, self.device, 1, guided, negative_prompt=[""] * len(prompts) if guided else None)
        out = {"pos/embeds": pe}
        if guided:
            out["neg/embeds"] = npe
        return out

    def noise(self, generator, height, width):
        f = self.pipe.vae_scale_factor
        c = self.denoiser.config.in_channels
        x = torch.randn((1, c, height // f, width // f), generator=generator, dtype=torch.float32)
        return x * self.pipe.scheduler.init_noise_sigma

    def levels(self, num_steps, latent_shape):
        sched = self.pipe.scheduler
        sched.set_timesteps(num_steps, device="cpu")
        ab = sched.alphas_cumprod
        stride = sched.config.num_train_timesteps // num_steps
        out = [float(ab[int(t)]) for t in sched.timesteps]
        last = int(sched.timesteps[-1]) - stride
        out.append(float(ab[last]) if last >= 0 else float(sched.final_alpha_cumprod))
        return out, sched.timesteps.clone()

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = _split(cond)

        def run(h, c):
            return model(h.to(self.dtype), t.expand(h.shape[0]).to(h.device), encoder_hidden_states=c["embeds"],
                         return_dict=False)[0]
        return self._guided(run, x, pos, neg if guided else None, guidance_scale)

    def decode(self, latents, height, width):
        vae = self.pipe.vae
        image = vae.decode((latents / vae.config.scaling_factor).to(vae.dtype), return_dict=False)[0]
        return self.pipe.image_processor.postprocess(image, output_type="pil", do_denormalize=[True] * len(image))


def family_of(pipe, size: tuple[int, int], num_frames: int = 1) -> Family:
    """The registered family serving the loaded pipeline's class (or one of its base classes)."""
    classes = [c.__name__ for c in type(pipe).__mro__]
    for _, fam in FAMILIES.items():
        if fam.pipeline in classes:
            return fam(pipe, size, num_frames)
    served = ", ".join(fam.pipeline for _, fam in FAMILIES.items())
    raise ValueError(f"{type(pipe).__name__} is not a supported pipeline ({served})")


def sd15_with_ddim(pipe) -> Any:
    """SD 1.5 pipelines train with DDIM (the scheduler swapped, its config kept)."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline
    if isinstance(pipe, StableDiffusionPipeline) and not isinstance(pipe.scheduler, DDIMScheduler):
        pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    return pipe
