"""The memory formula of a diffusion or flow-matching pipeline (the diffusion adapter's
`memory_model`; docs/memory-plan.md): the pipeline is built without weights (`weightless_pipeline`:
the tiny builder, or each component from its configuration file, on the meta device) and each pass
of a step is run on meta tensors at the recipe's sizes, its allocations traced (`meta_trace.py`):

- the update: one trained denoising step of a micro-batch's rows, the family's denoiser call
  (both classifier-free guidance passes where the recipe guides), the sampler's mean and the
  log-prob, and the backward (with or without checkpointing), the step's inputs (its rows' latents
  before and after it and their conditioning, copied from the batch) among them;
- the rollout: the text encoders' pass of the call's prompts, the conditioning held through the
  denoising loop, one gradient-free denoiser call of every row, the VAE's decode of
  `policy.decode_batch` of them; the largest of the passes beside the conditioning.

A pass's bytes are affine in its rows (no operator mixes rows), so each is traced at one and two
rows and the line is read at any count. The step's rollouts (their states and conditioning) are kept in
host memory (`host_bytes`) from the rollout to the update, and the update selects a copy of a
micro-batch's. The frozen components (text encoders, VAE) are the
training state's `frozen weights`; the denoiser is the module the plan's weights and gradients are
of. Families whose traces were not checked against the allocation probe are refused by name."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from mmrl.core.memory_model import MemoryModel, SizeAxis
from mmrl.errors import UserError

from ..model_loading import DTYPES, TINY_MODELS
from .checks import size_problems
from .family import Family, family_of
from .meta_trace import LiveBytes, traced_peak
from .meta_values import KnownValues
from .pipeline_configs import loaded_configs
from .samplers import LOGPROB_FORMS, SAMPLERS
from .video_families import VideoFamily

# the families whose traced passes were checked against the allocation probe (docs/benchmarks.md)
CHECKED_FAMILIES = ("PixelFlow", "PixelFlowUNet", "SD3", "Flux", "Wan", "Flux2Klein", "SD15", "QwenImage", "ZImage")
STATES = "rollouts' states (fp32 latents)"  # host memory, from the denoising loop on
LONGEST_SIDE = 4096  # pixels: the resolution searched under --gpu-memory, where the family has no bound of its own
LONGEST_VIDEO = 513  # frames: the frame counts searched under --gpu-memory


class DiffusionMemory(MemoryModel):
    """A pipeline's memory: its denoiser (`module`) trained, its other components frozen."""

    family = "diffusion pipeline (denoiser trained, text encoders and VAE frozen)"

    def __init__(self, pipe: Any, family: Family, cfg: Any, prompt_length: int):
        super().__init__(family.denoiser, cfg.gradient_checkpointing)
        self.pipe, self.fam, self.cfg = pipe, family, cfg
        self.prompt_length = prompt_length
        self.prompt = "a" * max(prompt_length, 1)
        self.guided = cfg.classifier_free_guidance
        self.family = f"{type(family).__name__} pipeline (denoiser trained, text encoders and VAE frozen)"
        self.module.requires_grad_(True)
        self._lines: dict[str, tuple[int, int]] = {}  # pass -> (bytes at 0 rows, per row)
        self._made: dict[int, tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}  # rows -> `_inputs`
        self._known = KnownValues()  # the conditioning's masks' values, made by `_encode`, read by the passes

    def frozen_bytes(self) -> dict[str, int]:
        return {name: sum(p.numel() * p.element_size() for p in module.parameters())
                for name, module in self.pipe.components.items()
                if isinstance(module, nn.Module) and module is not self.module}

    # ----- the traced passes, affine in the rows
    def _line(self, name: str) -> tuple[int, int]:
        """(bytes at 0 rows, bytes per row) of the pass `name`."""
        if name not in self._lines:
            one, two = (self._traced(name, rows) for rows in (1, 2))
            self._lines[name] = (2 * one - two, two - one)
        return self._lines[name]

    def _at(self, name: str, rows: int) -> int:
        base, per_row = self._line(name)
        return max(base + per_row * rows, 0)

    def _traced(self, name: str, rows: int) -> int:
        if name == "states":
            return (self.cfg.num_steps + 1) * self._inputs(rows)[0].numel() * 4
        if name == "conditioning":
            return sum(v.numel() * v.element_size() for v in self._inputs(rows)[1].values())
        if name == "encode":
            return traced_peak(lambda: self._encode(rows), known=self._known)
        if name == "decode":
            return traced_peak(lambda: self._decode(rows), known=self._known)
        x, cond = self._inputs(rows)
        step = torch.tensor(500.0, device="meta")  # a model timestep: its value changes no shape
        if name == "sample":
            with torch.no_grad():
                return traced_peak(lambda: self._predict(x, step, cond), known=self._known)
        return traced_peak(lambda: self._train(x, step, cond, name == "train checkpointed"), self.module, self._known)

    def _encode(self, rows: int) -> dict[str, torch.Tensor]:
        with torch.no_grad(), LiveBytes(self._known):  # its masks' values known (meta_values.py), traced or not
            return self.fam.encode([self.prompt] * rows, self.guided)

    def _inputs(self, rows: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A step's latents [rows, ...] and conditioning [rows, ...] per key (meta tensors)."""
        if rows not in self._made:
            noise = self.fam.noise(torch.Generator().manual_seed(0), self.cfg.height, self.cfg.width)
            self._made[rows] = torch.empty((rows, *noise.shape[1:]), device="meta"), self._encode(rows)
        return self._made[rows]

    def _predict(self, x: torch.Tensor, step: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.fam.predict(self.module, x, step, cond, self.cfg.guidance_scale, self.guided)

    def _train(self, x: torch.Tensor, step: torch.Tensor, cond: dict[str, torch.Tensor], checkpointed: bool) -> None:
        """A trained step as `StepUnits.terms` runs it: its rows' latents before and after it and their
        conditioning taken from the batch (copies), the denoiser's call, the sampler's mean and the
        log-prob, the backward."""
        switch = self.module.enable_gradient_checkpointing if checkpointed else self.module.disable_gradient_checkpointing
        switch()
        x, sample, cond = x.clone(), x.clone(), {k: v.clone() for k, v in cond.items()}
        levels = self.fam.levels(self.cfg.num_steps, tuple(x.shape))[0]
        strength = self.cfg.noise_level or 1.0  # a stochastic step's work (a zero strength trains no step)
        mean, std = SAMPLERS.get(self.cfg.sampler)(x.float(), self._predict(x, step, cond).float(), levels[0], levels[1],
                                                   strength)
        LOGPROB_FORMS[self.cfg.cps_logprob](sample, mean, std).sum().backward()

    def _decode(self, rows: int) -> None:
        vae = getattr(self.pipe, "vae", None)
        if vae is None:
            return
        x, _ = self._inputs(rows)
        with torch.no_grad():
            self.fam.decode(x, self.cfg.height, self.cfg.width)

    # ----- the sizes searched under --gpu-memory
    def size_axes(self) -> dict[str, SizeAxis]:
        """The resolution (the longer side in multiples of the family's size multiple up to its
        largest, the recipe's aspect kept) and, for a video family, the frame count (k x the VAE's
        temporal factor + 1, up to the most its denoiser takes)."""
        configs = loaded_configs(self.pipe).configs
        multiple = self.fam.size_multiple(configs)
        longest = self.fam.max_size(configs) or LONGEST_SIDE
        axes = {"resolution": SizeAxis(longest // multiple, lambda step: self._resolution(step * multiple, multiple))}
        if isinstance(self.fam, VideoFamily):
            factor, most = self.fam._temporal_factor(), min(self.fam.max_frames() or LONGEST_VIDEO, LONGEST_VIDEO)
            axes["frames"] = SizeAxis((most - 1) // factor + 1,
                                      lambda step: self._sized(num_frames=(step - 1) * factor + 1))
        return axes

    def _resolution(self, longer: int, multiple: int) -> tuple[dict[str, int], "DiffusionMemory"]:
        """The recipe at `longer` pixels on its longer side, the shorter one scaled to the nearest multiple."""
        short, long = sorted((self.cfg.height, self.cfg.width))
        shorter = max(multiple, round(longer * short / long / multiple) * multiple)
        tall = self.cfg.height >= self.cfg.width
        return self._sized(height=longer if tall else shorter, width=shorter if tall else longer)

    def _sized(self, **sizes: int) -> tuple[dict[str, int], "DiffusionMemory"]:
        cfg = replace(self.cfg, **sizes)
        family = family_of(self.pipe, (cfg.height, cfg.width), cfg.num_frames)
        return {f"policy.{k}": v for k, v in sizes.items()}, DiffusionMemory(self.pipe, family, cfg, self.prompt_length)

    # ----- the MemoryModel interface
    def activation_bytes(self, rows: int, checkpointing: bool) -> int:
        return self._at("train checkpointed" if checkpointing else "train", rows)

    def update_bytes(self, rows: int, prompts: int, trains_head: bool) -> dict[str, int]:
        return {"activations": self.activation_bytes(rows, self.checkpointing)}

    def host_bytes(self, rows: int, micro_batch: int) -> dict[str, int]:
        return {STATES: self._at("states", rows), "rollouts' conditioning": self._at("conditioning", rows),
                "a micro-batch's copy of both": self._at("states", micro_batch) + self._at("conditioning", micro_batch)}

    def rollout_bytes(self, rows: int, group_size: int) -> dict[str, int]:
        passes = {"text encoders": self._at("encode", rows), "denoiser call": self._at("sample", rows),
                  "VAE decode": self._at("decode", min(rows, self.cfg.decode_batch))}
        largest = max(passes, key=passes.get)
        return {"conditioning": self._at("conditioning", rows), f"largest pass: {largest}": passes[largest]}


class _Postprocessing:
    """The image (video) processor of a weightless pipeline: the tensor work of diffusers'
    `postprocess` (pixels from [-1, 1] to [0, 1], one image or video at a time), not the conversion
    to PIL images (host memory the allocator does not hand out)."""

    def postprocess(self, image: torch.Tensor, *args, **kwargs) -> list:
        (image * 0.5 + 0.5).clamp(0, 1)
        return []

    def postprocess_video(self, video: torch.Tensor, *args, **kwargs) -> list:
        for i in range(len(video)):
            self.postprocess(video[i].permute(1, 0, 2, 3))
        return []


def weightless_pipeline(cfg: Any) -> Any:
    """The pipeline of `cfg` with its modules on the meta device: the tiny builder's, or a local
    directory's or hub id's, each component built from its configuration file (tokenizers and the
    scheduler read as the run reads them: small files, no weights)."""
    if cfg.model.startswith("tiny:"):
        with torch.device("meta"):
            pipe = TINY_MODELS.get(cfg.model.removeprefix("tiny:"))(**cfg.tiny_args)
        if getattr(pipe, "scheduler", None) is not None:  # its tables (a DDIM's alphas) made again off the meta device
            pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
    else:
        pipe = _from_files(cfg.model)
    pipe = pipe if cfg.dtype == "float32" else pipe.to(DTYPES[cfg.dtype])
    for name in ("image_processor", "video_processor"):
        if hasattr(pipe, name):
            setattr(pipe, name, _Postprocessing())
    return pipe


def _from_files(model: str) -> Any:
    import diffusers
    import transformers
    local = Path(model).expanduser()

    def read(name: str) -> Path:
        if local.is_dir():
            return local / name
        from huggingface_hub import hf_hub_download
        return Path(hf_hub_download(model, name))

    index = json.loads(read("model_index.json").read_text())
    pipeline = getattr(diffusers, index["_class_name"], None)
    if pipeline is None:
        raise UserError(f"mmrl plan: policy.model={model}: its pipeline class {index['_class_name']} is not one "
                        "diffusers knows; its memory is not planned")
    components = {}
    for name, (library, cls) in ((k, v) for k, v in index.items() if not k.startswith("_") and isinstance(v, list)):
        components[name] = None if library is None else _component(model, name, getattr(
            diffusers if library == "diffusers" else transformers, cls), read)
    return pipeline(**components)


def _component(model: str, name: str, cls: type, read: Callable[[str], Path]) -> Any:
    """One component of a saved pipeline: a module built on the meta device from its configuration,
    a tokenizer or a scheduler loaded as the run loads it."""
    if isinstance(cls, type) and issubclass(cls, nn.Module):
        with torch.device("meta"):
            if hasattr(cls, "from_config") and not hasattr(cls, "_from_config"):  # diffusers'
                return cls.from_config(json.loads(read(f"{name}/config.json").read_text()))
            import transformers
            return cls._from_config(transformers.AutoConfig.from_pretrained(model, subfolder=name))
    return cls.from_pretrained(model, subfolder=name)


def diffusion_memory(cfg: Any, prompt_length: int) -> DiffusionMemory:
    """The formula over the weightless build of `cfg`'s pipeline; a family whose traces were not
    checked is refused by name."""
    for setting, value in (("units", cfg.units), ("turning_points", cfg.turning_points)):
        if value not in ("steps", False):  # other passes than a trained step's and a rollout's
            raise UserError(f"mmrl plan: the adapter DiffusionPolicy has no memory formula for policy.{setting}="
                            f"{value!r}; its memory is not planned")
    pipe = weightless_pipeline(cfg)
    if problems := size_problems(loaded_configs(pipe), cfg):
        raise UserError(f"mmrl plan: {problems[0]}")
    family = family_of(pipe, (cfg.height, cfg.width), cfg.num_frames)
    if type(family).__name__ not in CHECKED_FAMILIES:
        raise UserError(f"mmrl plan: the adapter DiffusionPolicy has no memory formula checked against the probe "
                        f"for the family {type(family).__name__} ({family.pipeline}) yet ({', '.join(CHECKED_FAMILIES)} "
                        "have); its memory is not planned")
    return DiffusionMemory(pipe, family, cfg, prompt_length)
