"""The video families of the diffusion adapter: Wan 2.1 / 2.2 text-to-video and image-to-video
(Wan 2.2 A14B's two experts as one denoiser, `experts.py`), HunyuanVideo text-to-video, through
the stock diffusers pipelines (`family.py` for the interface).
Latents are [B, C, F, H, W] with F = (num_frames - 1) // temporal factor + 1; a unit is still one
denoising step, so every sampler, schedule and the closed-form KL apply unchanged."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from .experts import TimestepExperts
from .family import FAMILIES, Configs, Family, patch_size, split_cond


class VideoFamily(Family):
    """What the video pipelines share: 5-D noise in float32, the Euler flow scheduler's levels,
    VAE decoding to frames (`pipe.video_processor`)."""

    batched_guidance = False
    output = "video"
    fps = 16  # frames per second the family's videos are exported at (diffusers' examples)

    def _temporal_factor(self) -> int:
        """How many frames the VAE compresses into one latent frame."""
        return self.pipe.vae_scale_factor_temporal

    def max_frames(self) -> int | None:
        """The most frames the denoiser can take (None: no bound of its own)."""
        return None

    def check_settings(self, cfg):
        factor = self._temporal_factor()
        if cfg.num_frames < 1 or (cfg.num_frames - 1) % factor:
            raise ValueError(f"policy.num_frames={cfg.num_frames}: {type(self).__name__} needs {factor}k + 1 frames "
                             f"(its VAE compresses time {factor}x)")
        super().check_settings(cfg)

    def _noise_channels(self) -> int:
        return self.denoiser.config.in_channels

    def noise(self, generator, height, width):
        frames = (self.num_frames - 1) // self.pipe.vae_scale_factor_temporal + 1
        f = self.pipe.vae_scale_factor_spatial
        shape = (1, self._noise_channels(), frames, height // f, width // f)
        return torch.randn(shape, generator=generator, dtype=torch.float32)

    def levels(self, num_steps, latent_shape):
        self.pipe.scheduler.set_timesteps(num_steps, device="cpu")
        return self.pipe.scheduler.sigmas.tolist(), self.pipe.scheduler.timesteps.clone()

    def image_latents(self, pixels):
        raise ValueError("the supervised warm start trains on target images; a video family has no image targets")

    def _frames(self, video: Tensor) -> list:
        return self.pipe.video_processor.postprocess_video(video, output_type="pil")


def with_euler_flow_scheduler(pipe) -> None:
    """The Wan checkpoints ship UniPC (a multistep solver, no one-step Gaussian policy): rollouts use
    the flow-matching Euler scheduler instead, with the checkpoint's flow shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    if not isinstance(pipe.scheduler, FlowMatchEulerDiscreteScheduler):
        config = pipe.scheduler.config
        pipe.scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=config.get("num_train_timesteps", 1000),
                                                         shift=config.get("flow_shift") or 1.0)


def wan_denoiser(pipe) -> nn.Module:
    """What a Wan pipeline denoises with, as its call picks it: the transformer, or with a
    `boundary_ratio` and a `transformer_2` (Wan 2.2 A14B) both experts switched at the boundary
    timestep (`experts.TimestepExperts`)."""
    ratio = pipe.config.get("boundary_ratio")
    if pipe.transformer is None:
        raise ValueError(f"{type(pipe).__name__} has no `transformer` (the high-noise expert): load the pipeline "
                         "with both experts")
    if ratio is None or getattr(pipe, "transformer_2", None) is None:
        return pipe.transformer
    boundary = ratio * pipe.scheduler.config.num_train_timesteps
    return TimestepExperts({"transformer": pipe.transformer, "transformer_2": pipe.transformer_2}, boundary)


@FAMILIES.register("wan")
class Wan(VideoFamily):
    pipeline = "WanPipeline"
    max_sequence_length = 512  # the pipelines' default prompt length

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """The Wan VAE's `scale_factor_spatial` (8 unless its config says) times the patch's side."""
        return (configs.get("vae") or {}).get("scale_factor_spatial", 8) * patch_size(configs)

    @classmethod
    def max_size(cls, configs: Configs) -> int | None:
        """The denoiser's rotary positions cover `rope_max_seq_len` patches a side."""
        most = (configs.get("transformer") or {}).get("rope_max_seq_len")
        return most * cls.size_multiple(configs) if most else None

    def max_frames(self) -> int | None:
        """The frames whose latent frames the rotary positions cover (`rope_max_seq_len` patches)."""
        config = self.denoiser.config
        return (config.rope_max_seq_len * config.patch_size[0] - 1) * self._temporal_factor() + 1

    def __init__(self, pipe, size, num_frames=1):
        super().__init__(pipe, size, num_frames)
        with_euler_flow_scheduler(pipe)
        self._denoiser = wan_denoiser(pipe)

    @classmethod
    def guidance_scale_2_problem(cls, configs: Configs) -> str | None:
        return None if "transformer_2" in configs else super().guidance_scale_2_problem(configs)

    def _scale(self, x: Tensor, t: Tensor, guidance_scale: float) -> float | Tensor:
        """The CFG scale of each row: `policy.guidance_scale`, and with two experts and
        `policy.guidance_scale_2` that one below their boundary timestep (as the stock call switches;
        `checks.family_problems` refuses the setting without them)."""
        if self.low_noise_scale is None:
            return guidance_scale
        low = t.expand(x.shape[0]).to(x.device) < self._denoiser.boundary
        scale = torch.where(low, self.low_noise_scale, guidance_scale).to(torch.float32)
        return scale.view(-1, *[1] * (x.dim() - 1))

    @property
    def denoiser(self) -> nn.Module:
        return self._denoiser

    def encode(self, prompts, guided):
        pe, npe = self.pipe.encode_prompt(prompt=prompts, negative_prompt=[""] * len(prompts) if guided else None,
                                          do_classifier_free_guidance=guided, num_videos_per_prompt=1,
                                          max_sequence_length=self.max_sequence_length, device=self.device)
        return {"pos/embeds": pe.to(self.dtype), **({"neg/embeds": npe.to(self.dtype)} if guided else {})}

    def _inputs(self, x: Tensor, cond: dict) -> tuple[Tensor, dict]:
        return x, {}

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)

        def run(h, c):
            hidden, extra = self._inputs(h, pos)  # the image conditioning is the same for both CFG passes
            # one timestep per video: Wan 2.2 TI2V-5B's text-to-video gives each token the same value
            return model(hidden_states=hidden.to(self.dtype), timestep=t.expand(h.shape[0]).to(h.device),
                         encoder_hidden_states=c["embeds"], return_dict=False, **extra)[0]
        return self._guided(run, x, pos, neg if guided else None, self._scale(x, t, guidance_scale))

    def decode(self, latents, height, width):
        vae = self.pipe.vae
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, vae.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, vae.dtype)
        video = vae.decode(latents.to(vae.dtype) / inv_std + mean, return_dict=False)[0]
        return self._frames(video)


@FAMILIES.register("wan_i2v")
class WanImageToVideo(Wan):
    """The prompt's image (`policy.image_column`) conditions every step: the VAE latents of the
    image followed by black frames, with a mask of the first frame, are concatenated to the noisy
    latents on the channel axis; Wan 2.1 I2V also cross-attends to the image's CLIP embedding."""

    pipeline = "WanImageToVideoPipeline"
    conditioning_image = True

    def __init__(self, pipe, size, num_frames=1):
        super().__init__(pipe, size, num_frames)
        if pipe.config.get("expand_timesteps", False):
            raise ValueError("WanImageToVideoPipeline with expand_timesteps (Wan 2.2 TI2V-5B image-to-video) is not "
                             "supported; its text-to-video mode is (WanPipeline)")

    def _noise_channels(self) -> int:
        return self.pipe.vae.config.z_dim

    def image_condition(self, images):
        pipe, (height, width) = self.pipe, self.size
        out: dict[str, list[Tensor]] = {"condition": [], "image_embeds": []}
        for image in images:
            pixels = pipe.video_processor.preprocess(image, height=height, width=width).to(self.device, torch.float32)
            shape = (1, pipe.vae.config.z_dim, (self.num_frames - 1) // pipe.vae_scale_factor_temporal + 1,
                     height // pipe.vae_scale_factor_spatial, width // pipe.vae_scale_factor_spatial)
            _, condition = pipe.prepare_latents(pixels, 1, shape[1], height, width, self.num_frames, torch.float32,
                                                self.device, latents=torch.zeros(shape, device=self.device))
            out["condition"].append(condition)
            if self.denoiser.config.image_dim is not None:
                out["image_embeds"].append(pipe.encode_image(image, self.device).to(self.dtype))
        return {f"pos/{k}": torch.cat(v) for k, v in out.items() if v}  # kept once, read by both CFG passes

    def _inputs(self, x, cond):
        extra = {"encoder_hidden_states_image": cond["image_embeds"]} if "image_embeds" in cond else {}
        return torch.cat([x, cond["condition"].to(x.dtype)], dim=1), extra


@FAMILIES.register("hunyuan_video")
class HunyuanVideo(VideoFamily):
    """Guidance-distilled: the guidance scale enters as an embedding (x 1000), `policy.guidance_scale`
    without CFG. With `policy.classifier_free_guidance` the stock call's true CFG: two forwards, the
    prompt and an empty negative prompt, both with the embedding at `policy.embedded_guidance_scale`,
    combined as u + g (c - u) at g = `policy.guidance_scale` (its `true_cfg_scale`)."""

    pipeline = "HunyuanVideoPipeline"
    guidance_embedding_with_cfg = True
    max_sequence_length = 256
    fps = 15

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """The VAE's `spatial_compression_ratio` (8 unless its config says) times the patch size."""
        return (configs.get("vae") or {}).get("spatial_compression_ratio", 8) * patch_size(configs)

    def encode(self, prompts, guided):
        out = {}
        for side, texts in (("pos", prompts), ("neg", [""] * len(prompts) if guided else None)):
            if texts is not None:
                pe, pooled, mask = self.pipe.encode_prompt(prompt=texts, device=self.device,
                                                           max_sequence_length=self.max_sequence_length)
                out.update({f"{side}/embeds": pe.to(self.dtype), f"{side}/pooled": pooled.to(self.dtype),
                            f"{side}/mask": mask.to(self.dtype)})
        return out

    def levels(self, num_steps, latent_shape):
        sigmas = np.linspace(1.0, 0.0, num_steps + 1)[:-1]
        self.pipe.scheduler.set_timesteps(sigmas=sigmas, device="cpu")
        return self.pipe.scheduler.sigmas.tolist(), self.pipe.scheduler.timesteps.clone()

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)
        n = x.shape[0]
        embedded = self.embedded_scale if guided else guidance_scale
        guidance = torch.full((n,), embedded, dtype=self.dtype, device=x.device) * 1000.0

        def run(h, c):
            return model(hidden_states=h.to(self.dtype), timestep=t.expand(n).to(h.device, torch.float32),
                         encoder_hidden_states=c["embeds"], encoder_attention_mask=c["mask"],
                         pooled_projections=c["pooled"], guidance=guidance, return_dict=False)[0]
        return self._guided(run, x, pos, neg if guided else None, guidance_scale)

    def decode(self, latents, height, width):
        vae = self.pipe.vae
        video = vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor, return_dict=False)[0]
        return self._frames(video)
