"""The image families of the diffusion adapter (the `Family` interface and its registry: `family.py`):

    SD3 / SD3.5  StableDiffusion3Pipeline, FlowMatchEulerDiscreteScheduler: flow matching, CFG
    FLUX.1       FluxPipeline: flow matching on packed 2x2 latents, guidance as an embedding
    SD 1.5       StableDiffusionPipeline, its scheduler swapped for DDIM: eps prediction, CFG

(video families: `video_families.py`). Each runs the pipeline's own encoders and scheduler.
"""

from __future__ import annotations

import numpy as np
import torch

from .family import FAMILIES, Configs, Family, patch_size, split_cond, vae_scale


def flow_shift_mu(pipe, image_seq_len: int) -> float | None:
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift
    c = pipe.scheduler.config
    if not c.get("use_dynamic_shifting", False):
        return None
    return calculate_shift(image_seq_len, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                           c.get("base_shift", 0.5), c.get("max_shift", 1.15))


def linear_sigma_levels(pipe, num_steps: int, mu: float | None) -> tuple[list[float], torch.Tensor]:
    """The levels the FLUX-style pipelines set: sigmas from 1 down to 1/num_steps in equal steps, shifted
    by `mu` (None: the scheduler's own static shift); (sigmas with the final 0, timesteps)."""
    sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
    pipe.scheduler.set_timesteps(sigmas=sigmas, device="cpu", **({"mu": mu} if mu is not None else {}))
    return pipe.scheduler.sigmas.tolist(), pipe.scheduler.timesteps.clone()


class PackedFlowLatents:
    """What FLUX.1 and Qwen-Image share: latents at the VAE's scale rounded to 2x2 patches, packed into
    tokens by the pipeline, and FLUX's equal-step sigmas shifted by the packed sequence's length."""

    def _latent_hw(self, height: int, width: int) -> tuple[int, int]:
        f = self.pipe.vae_scale_factor
        return 2 * (height // (f * 2)), 2 * (width // (f * 2))

    def levels(self, num_steps, latent_shape):
        return linear_sigma_levels(self.pipe, num_steps, flow_shift_mu(self.pipe, latent_shape[-2]))


@FAMILIES.register("sd3")
class SD3(Family):
    pipeline = "StableDiffusion3Pipeline"

    @classmethod
    def max_size(cls, configs: Configs) -> int | None:
        """The MMDiT's learned positions cover `pos_embed_max_size` patches a side."""
        most = (configs.get("transformer") or {}).get("pos_embed_max_size")
        return most * patch_size(configs) * vae_scale(configs) if most else None

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
        mu = flow_shift_mu(self.pipe, (latent_shape[-2] // p) * (latent_shape[-1] // p))
        self.pipe.scheduler.set_timesteps(num_steps, device="cpu", **({"mu": mu} if mu is not None else {}))
        return self.pipe.scheduler.sigmas.tolist(), self.pipe.scheduler.timesteps.clone()

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)

        def run(h, c):
            return model(hidden_states=h.to(self.dtype), timestep=t.expand(h.shape[0]).to(h.device),
                         encoder_hidden_states=c["embeds"], pooled_projections=c["pooled"], return_dict=False)[0]
        return self._guided(run, x, pos, neg if guided else None, guidance_scale)

    def decode(self, latents, height, width):
        return self._vae_image(latents)


@FAMILIES.register("flux")
class Flux(PackedFlowLatents, Family):
    """Guidance-distilled: the guidance scale enters as an embedding, `policy.guidance_scale` without
    CFG. With `policy.classifier_free_guidance` the stock call's true CFG (`true_cfg_scale` with a
    negative prompt): two forwards, the prompt and an empty negative prompt, both with the embedding
    at `policy.embedded_guidance_scale`, combined as u + g (c - u) at g = `policy.guidance_scale`."""

    pipeline = "FluxPipeline"
    batched_guidance = False  # the stock call's two forwards
    guidance_embedding_with_cfg = True

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """The latents are packed in 2x2 patches (`_pack_latents`) before the transformer's own."""
        return 2 * super().size_multiple(configs)

    def encode(self, prompts, guided):
        out = {}
        for side, texts in (("pos", prompts), ("neg", [""] * len(prompts) if guided else None)):
            if texts is not None:
                pe, pooled, _ = self.pipe.encode_prompt(prompt=texts, prompt_2=None, device=self.device,
                                                        num_images_per_prompt=1)
                out.update({f"{side}/embeds": pe, f"{side}/pooled": pooled})
        return out

    def noise(self, generator, height, width):
        h, w = self._latent_hw(height, width)
        c = self.denoiser.config.in_channels // 4
        x = torch.randn((1, c, h, w), generator=generator, dtype=torch.float32)
        return self.pipe._pack_latents(x, 1, c, h, w)

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)
        n = x.shape[0]
        hidden, img_ids = self._image_tokens(x, pos)  # both passes see the same image tokens (an edit's source too)
        embedded = self.embedded_scale if guided else guidance_scale
        guidance = (torch.full((n,), embedded, device=x.device, dtype=torch.float32)
                    if self.denoiser.config.guidance_embeds else None)

        def run(h, c):
            txt_ids = torch.zeros(c["embeds"].shape[1], 3, device=x.device, dtype=self.dtype)
            return model(hidden_states=h.to(self.dtype), timestep=(t.expand(n).to(x.device, self.dtype) / 1000),
                         guidance=guidance, pooled_projections=c["pooled"], encoder_hidden_states=c["embeds"],
                         txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0][:, :x.shape[1]]
        return self._guided(run, hidden, pos, neg if guided else None, guidance_scale)

    def _image_tokens(self, x: torch.Tensor, pos: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The transformer's image tokens [N, L, C] and their position ids [L, 3]: the noisy latents'
        alone (an editing family appends its source image's)."""
        h, w = (d // 2 for d in self._latent_hw(*self.size))
        return x, self.pipe._prepare_latent_image_ids(x.shape[0], h, w, x.device, self.dtype)

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

    def __init__(self, pipe, size, num_frames=1):
        super().__init__(pipe, size, num_frames)
        with_ddim_scheduler(pipe)

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
        pos, neg = split_cond(cond)

        def run(h, c):
            return model(h.to(self.dtype), t.expand(h.shape[0]).to(h.device), encoder_hidden_states=c["embeds"],
                         return_dict=False)[0]
        return self._guided(run, x, pos, neg if guided else None, guidance_scale)

    def decode(self, latents, height, width):
        vae = self.pipe.vae
        image = vae.decode((latents / vae.config.scaling_factor).to(vae.dtype), return_dict=False)[0]
        return self.pipe.image_processor.postprocess(image, output_type="pil", do_denormalize=[True] * len(image))


def with_ddim_scheduler(pipe) -> None:
    """SD 1.5 pipelines train with DDIM (the scheduler swapped, its config kept)."""
    from diffusers import DDIMScheduler
    if not isinstance(pipe.scheduler, DDIMScheduler):
        pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
