"""The `Family` interface: everything the diffusion adapter knows about one diffusers pipeline family,
and the `FAMILIES` registry `family_of` picks a loaded pipeline's family from. A family says how
the pipeline conditions on a prompt (text, and an image where the prompt row brings one), what it
draws (images, videos or sound) and the sizes it can draw (read from its components' configs, so that a
recipe is checked before the weights load: `pipeline_configs.py`), the initial noise's shape, the
step levels and model timesteps (from the pipeline's own scheduler, so the ODE path equals the
stock pipeline's output), one denoiser call with its guidance, decoding to
PIL images (a video: a list of frames), the warm start's noising, which policy settings it needs
and the columns its completions carry to the rewards. Levels are sigmas s (flow) or cumulative
alphas ab (eps models); `levels[k] -> levels[k + 1]` is step k. The families themselves live in
`families.py` (images) and `video_families.py` (videos), the sound ones in `stable_audio3.py` and
`audioldm2.py`; a new one is one more class in either, or a module of its own imported in
`tasks/diffusion/__init__.py`.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor, nn

from mmrl.registry import Registry

Cond = dict[str, Tensor]
Configs = dict[str, dict[str, Any]]  # a pipeline's component (vae, transformer, unet) -> its config
FAMILIES: Registry[type] = Registry("diffusion pipeline family")


def vae_scale(configs: Configs) -> int:
    """How many pixels a latent spans on a side: 2 per level of the VAE past its first (1 without a VAE)."""
    vae = configs.get("vae") or {}
    return 2 ** (len(vae["block_out_channels"]) - 1) if vae.get("block_out_channels") else 1


def patch_size(configs: Configs) -> int:
    """The denoiser's spatial patch size (1 for a UNet, which has none)."""
    denoiser = configs.get("transformer") or configs.get("unet") or {}
    patch = denoiser.get("patch_size") or 1
    return int(patch[-1] if isinstance(patch, (list, tuple)) else patch)


class Family:
    """One pipeline family; `denoiser` is the module RL trains. A subclass registers in FAMILIES
    and names the diffusers pipeline class it serves in `pipeline` (by name, so that diffusers is
    imported only when a pipeline is loaded); `family_of` picks the family of a loaded pipeline.
    Its `__init__` may adapt the pipeline (a scheduler the samplers step with) or refuse it."""

    pipeline = ""  # the pipeline class (or a base class) of the pipelines this family serves
    kind = "flow"  # "flow": the model predicts v;  "eps": it predicts the noise
    batched_guidance = True  # CFG as one call on [uncond, cond] (False: two calls, as the video pipelines)
    conditioning_image = False  # the prompt comes with an image (`image_condition`)
    most_conditioning_images: int | None = 1  # images a row's `policy.image_column` may list (None: any number)
    guidance_embedding_with_cfg = False  # CFG beside a guidance embedding (`policy.embedded_guidance_scale`)
    embedded_scale: float | None = None  # that embedding's value under CFG (`check_settings` keeps it)
    low_noise_scale: float | None = None  # a second expert's CFG scale (`policy.guidance_scale_2`; `check_settings`)
    output = "image"  # what a completion is (`Policy.output_kind`): an image, a video's frames, or audio (a waveform)
    fps: int | None = None  # a video family's frames per second (its rows' `fps` column); None: images

    def __init__(self, pipe, size: tuple[int, int], num_frames: int = 1):
        self.pipe = pipe
        self.size = size  # image (height, width)
        self.num_frames = num_frames  # frames of a video (video families)

    @property
    def denoiser(self) -> nn.Module:
        return self.pipe.transformer

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """What every height and width must be a multiple of in the pipeline whose component configs
        are `configs`: the VAE's downsampling times the denoiser's patch size."""
        return vae_scale(configs) * patch_size(configs)

    @classmethod
    def max_size(cls, configs: Configs) -> int | None:
        """The largest height or width the pipeline can draw (None: no bound of its own)."""
        return None

    def encode(self, prompts: list[str], guided: bool) -> Cond:
        raise NotImplementedError

    def image_condition(self, images: list) -> Cond:
        """Conditioning from one image per prompt (image-to-video families), under `pos/` keys: both
        classifier-free guidance passes read it."""
        raise NotImplementedError

    def condition(self, prompts: list[str], images: list | None, guided: bool) -> Cond:
        """The conditioning of each prompt and, for a family with `conditioning_image`, its row's
        image: the text's, then the image's (an editing family, whose text encoder reads the
        source image with the instruction, conditions on both at once)."""
        cond = self.encode(prompts, guided)
        if images is not None:
            cond.update(self.image_condition(images))
        return cond

    def noise(self, generator: torch.Generator, height: int, width: int) -> Tensor:
        raise NotImplementedError

    def levels(self, num_steps: int, latent_shape: tuple[int, ...]) -> tuple[list[float], Tensor]:
        raise NotImplementedError

    def predict(self, model: nn.Module, x: Tensor, t: Tensor, cond: Cond, guidance_scale: float,
                guided: bool) -> Tensor:
        raise NotImplementedError

    def decode(self, latents: Tensor, height: int, width: int) -> list:
        raise NotImplementedError

    @property
    def deterministic_sampler(self) -> str:
        """The sampler of greedy rollouts and of ODE completions: DDIM for eps models, Euler for flow."""
        return "ddim" if self.kind == "eps" else "ode"

    def check_settings(self, cfg: Any) -> None:
        """Take the policy settings (a `DiffusionConfig`) this family keeps; raise where they do not fit
        its loaded modules (what its configs refuse, `checks.family_problems` refused before)."""
        self.embedded_scale = cfg.embedded_guidance_scale
        self.low_noise_scale = cfg.guidance_scale_2
        if cfg.vae_tiling and not hasattr(self.pipe.vae, "enable_tiling"):
            raise ValueError(f"policy.vae_tiling=true: the VAE of {type(self.pipe).__name__} has no tiled decoding")

    @classmethod
    def guidance_scale_2_problem(cls, configs: Configs) -> str | None:
        """Why `policy.guidance_scale_2` (a low-noise expert's CFG scale) does not fit the pipeline of
        component `configs`; None where it does (a family of two experts says so)."""
        return (f"policy.guidance_scale_2 is set: {cls.__name__} has no low-noise expert to guide with it (Wan 2.2 "
                "A14B's transformer_2); use policy.guidance_scale")

    @classmethod
    def guidance_terms_problem(cls, configs: Configs, cfg: Any) -> str | None:
        """Why the guidance terms beyond CFG (`policy.stg_scale`, `stg_blocks`, `modality_scale`,
        `guidance_rescale`: LTX-2's, `ltx2_guidance.py`) do not fit the pipeline of component
        `configs`; None where they do (all off here: a family that takes them says so)."""
        on = {"stg_scale": cfg.stg_scale > 0, "modality_scale": cfg.modality_scale > 1,
              "guidance_rescale": cfg.guidance_rescale > 0}
        if names := [name for name, value in on.items() if value]:
            return (f"{', '.join(f'policy.{n}={getattr(cfg, n)}' for n in names)}: {cls.__name__} has no such guidance "
                    "term (spatio-temporal guidance, modality isolation and guidance rescale are LTX-2's)")
        return None

    def set_flow_shift(self, shift: float) -> None:
        """Replace the scheduler by the same one with timestep shift `shift` (`policy.flow_shift`)."""
        sched = self.pipe.scheduler
        if self.kind != "flow" or "shift" not in sched.config:
            raise ValueError(f"policy.flow_shift={shift}: {type(sched).__name__} of {type(self.pipe).__name__} "
                             "is not a flow-matching scheduler with a shift")
        if sched.config.get("use_dynamic_shifting", False):
            raise ValueError(f"policy.flow_shift={shift}: the scheduler of {type(self.pipe).__name__} shifts by "
                             "resolution (use_dynamic_shifting); a fixed shift would be ignored")
        self.pipe.scheduler = type(sched).from_config(sched.config, shift=shift)

    def set_source_area(self, area: int) -> None:
        """Resize each source image to `area` pixels (`policy.source_area`; an editing family's)."""
        raise ValueError(f"policy.source_area={area}: {type(self.pipe).__name__} takes no source image to resize")

    @classmethod
    def duration_problem(cls, configs: Configs, seconds: float) -> str | None:
        """What is wrong with drawing `seconds` of sound (`policy.duration`) in the pipeline whose
        component configs are `configs` (None: nothing): only a sound family draws a duration."""
        return f"policy.duration={seconds}: {cls.pipeline} draws no sound of a duration"

    def set_duration(self, seconds: float) -> None:
        """Draw `seconds` of sound (`policy.duration`; a sound family's)."""
        raise ValueError(self.duration_problem({}, seconds))

    def enable_tiling(self) -> None:
        """Decode with the VAE's own tiling (`policy.vae_tiling`: spatial tiles, temporal ones for video)."""
        self.pipe.vae.enable_tiling()

    @classmethod
    def completion_columns(cls, cfg: Any) -> dict[str, Any]:
        """What each completion carries to the rewards besides itself, one value for all (a video's
        frames per second, `policy.fps` or the family's); {} for images."""
        return {} if cls.fps is None else {"fps": cfg.fps or cls.fps}

    def noised(self, x0: Tensor, eps: Tensor, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """The warm start's training example from clean latents x0 [B, ...] and noise eps [B, ...]:
        (noisy x [B, ...], model timesteps t [B], target [B, ...]), the noise level drawn from the
        global RNG. Flow: x_s = (1 - s) x0 + s eps, s ~ U(0, 1), target v = eps - x0 (rectified
        flow); eps models: x_t = sqrt(ab_t) x0 + sqrt(1 - ab_t) eps, t ~ U{0..T-1}, target eps (DDPM)."""
        shape = (-1,) + (1,) * (x0.dim() - 1)
        if self.kind == "flow":
            s = torch.rand(len(x0), device=device)
            x = (1 - s.view(shape)) * x0 + s.view(shape) * eps
            return x, s * self.pipe.scheduler.config.num_train_timesteps, eps - x0
        t = torch.randint(0, self.pipe.scheduler.config.num_train_timesteps, (len(x0),), device=device)
        ab = self.pipe.scheduler.alphas_cumprod.to(device)[t].view(shape)
        return ab.sqrt() * x0 + (1 - ab).sqrt() * eps, t, eps

    def decode_in_batches(self, latents: Tensor, cfg: Any, cond: Cond | None = None) -> list:
        """The completions of latents [N, ...] with their rows' conditioning `cond` ([N, ...] per key),
        `policy.decode_batch` at a time, at the configured size."""
        out = []
        for i in range(0, len(latents), cfg.decode_batch):
            rows = {k: v[i:i + cfg.decode_batch] for k, v in (cond or {}).items()}
            out += self.decode_conditioned(latents[i:i + cfg.decode_batch].to(self.dtype), rows, cfg.height, cfg.width)
        return out

    def decode_conditioned(self, latents: Tensor, cond: Cond, height: int, width: int) -> list:
        """`decode` of latents [B, ...] with their rows' conditioning [B, ...] per key, which a family whose
        completion holds part of its conditioning reads (LTX-2 image to video: the image's latent frame)."""
        return self.decode(latents, height, width)

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

    def _guided(self, run, x: Tensor, cond_pos: dict, cond_neg: dict | None, guidance_scale: float | Tensor) -> Tensor:
        """CFG as the pipelines do it: one batched call on [uncond, cond], u + g (c - u) (g a number, or
        one per row shaped to broadcast)."""
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


def image_column_problem(family: type[Family], cfg: Any) -> str | None:
    """What is missing when `family` conditions each prompt on an image and `policy.image_column` is unset."""
    if family.conditioning_image and not cfg.image_column:
        return (f"policy.image_column is not set: {family.__name__} conditions each prompt on an image; name the "
                "data column that holds it")
    return None


def embedded_guidance_problem(family: type[Family], cfg: Any) -> str | None:
    """What is missing when `family` takes true CFG beside its guidance embedding and the embedding's value is unset."""
    if family.guidance_embedding_with_cfg and cfg.classifier_free_guidance and cfg.embedded_guidance_scale is None:
        return (f"policy.embedded_guidance_scale is not set: {family.__name__} with policy.classifier_free_guidance="
                "true (true CFG at policy.guidance_scale) also takes its guidance embedding's value (the stock "
                "call's guidance_scale)")
    return None


def split_cond(cond: Cond) -> tuple[dict, dict | None]:
    """(the positive conditioning, the negative one or None) without their `pos/` `neg/` prefixes."""
    pos = {k[4:]: v for k, v in cond.items() if k.startswith("pos/")}
    neg = {k[4:]: v for k, v in cond.items() if k.startswith("neg/")}
    return pos, (neg or None)


def family_class(classes: Sequence[str]) -> type[Family] | None:
    """The registered family serving a pipeline of one of `classes` (its class and base classes)."""
    return next((fam for _, fam in FAMILIES.items() if fam.pipeline in classes), None)


def family_of(pipe, size: tuple[int, int], num_frames: int = 1) -> Family:
    """The registered family serving the loaded pipeline's class (or one of its base classes)."""
    family = family_class([c.__name__ for c in type(pipe).__mro__])
    if family is None:
        served = ", ".join(fam.pipeline for _, fam in FAMILIES.items())
        raise ValueError(f"{type(pipe).__name__} is not a supported pipeline ({served})")
    return family(pipe, size, num_frames)
