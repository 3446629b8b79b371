"""How a trained denoiser is written, in the formats the diffusers ecosystem loads. A LoRA: the
PEFT adapter of the denoiser, and the same weights in the diffusers LoRA format
(`pytorch_lora_weights.safetensors`, rank and alpha in its metadata), so that
`pipe.load_lora_weights(path)` on the stock pipeline applies it (a pipeline without diffusers LoRA
support, whose denoiser loads LoRA adapters, gets the same file for `pipe.transformer.load_lora_adapter`;
others keep PEFT's alone). Full weights: the whole pipeline with the trained denoiser in place,
loadable by `DiffusionPipeline.from_pretrained(path)`.

A denoiser made of two experts (`experts.TimestepExperts`, Wan 2.2 A14B) writes one diffusers
LoRA file per expert: the high-noise one (`transformer`) as `pytorch_lora_weights.safetensors`,
the low-noise one as `pytorch_lora_weights_transformer_2.safetensors`, which the stock pipeline
loads with `pipe.load_lora_weights(path, weight_name=..., load_into_transformer_2=True)`; its full
weights put each expert in its own component.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

from torch import Tensor, nn

from .experts import TimestepExperts

LORA_FILE = "pytorch_lora_weights.safetensors"  # diffusers' own name, which load_lora_weights finds alone


def expert_lora_file(component: str) -> str:
    """The diffusers LoRA file of a two-expert denoiser's `component` (the first expert's is diffusers' own)."""
    return LORA_FILE if component == "transformer" else f"pytorch_lora_weights_{component}.safetensors"


def save_denoiser(pipe: Any, denoiser: nn.Module, model: nn.Module, path: Path,
                  state_dict: dict[str, Tensor] | None, plain_class: Callable[[nn.Module], type]) -> None:
    """Write `model`, the trained `denoiser` of `pipe` (`Policy.save_pretrained`); `state_dict`: the
    whole weights of a sharded `model`, loaded into a plain module of `plain_class(model)`."""
    experts = isinstance(denoiser, TimestepExperts)
    names = denoiser.component_names if experts else (next(k for k, v in pipe.components.items() if v is denoiser),)
    if hasattr(model, "peft_config"):
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
        _save_diffusers_lora(pipe, denoiser, model, path, state_dict, names, experts)
        return
    if experts:
        trained = {name: _plain(getattr(model, name), name, state_dict, plain_class) for name in names}
    else:
        trained = {names[0]: _plain(model, "", state_dict, plain_class)}
    type(pipe)(**{**pipe.components, **_pipeline_settings(pipe), **trained}).save_pretrained(path,
                                                                                        safe_serialization=True)


def _pipeline_settings(pipe: Any) -> dict[str, Any]:
    """The pipeline's own settings beside its components (Wan's `boundary_ratio` and
    `expand_timesteps`, FLUX.2 [klein]'s `is_distilled`), which a rebuilt pipeline must keep."""
    accepted = inspect.signature(type(pipe).__init__).parameters
    return {k: v for k, v in pipe.config.items() if k in accepted and k not in pipe.components}


def _save_diffusers_lora(pipe: Any, denoiser: nn.Module, model: nn.Module, path: Path,
                         state_dict: dict[str, Tensor] | None, names: tuple[str, ...], experts: bool) -> None:
    """The adapter in the diffusers LoRA format: one file per expert of a two-expert denoiser. A
    pipeline without diffusers LoRA support (HunyuanVideo 1.5) gets the same file where its denoiser
    loads it (`pipe.transformer.load_lora_adapter(path, prefix="transformer")`); else PEFT's alone."""
    from peft.utils import get_peft_model_state_dict
    if not hasattr(pipe, "save_lora_weights") and not hasattr(denoiser, "load_lora_adapter"):
        return
    layers = {k.removeprefix("base_model.model."): v
              for k, v in get_peft_model_state_dict(model, state_dict=state_dict).items()}
    metadata = model.peft_config[model.active_adapter].to_dict()
    if not hasattr(pipe, "save_lora_weights"):
        from diffusers.loaders.lora_base import LoraBaseMixin
        LoraBaseMixin._save_lora_weights(path, {names[0]: layers}, {names[0]: metadata}, weight_name=LORA_FILE)
        return
    if not experts:
        pipe.save_lora_weights(path, **{f"{names[0]}_lora_layers": layers,
                                        f"{names[0]}_lora_adapter_metadata": metadata})
        return
    for name in names:  # each expert's file holds it as the pipeline's `transformer`, as diffusers loads it
        own = {k.removeprefix(f"{name}."): v for k, v in layers.items() if k.startswith(f"{name}.")}
        pipe.save_lora_weights(path, transformer_lora_layers=own, transformer_lora_adapter_metadata=metadata,
                               weight_name=expert_lora_file(name))


def _plain(module: nn.Module, prefix: str, state_dict: dict[str, Tensor] | None,
           plain_class: Callable[[nn.Module], type]) -> nn.Module:
    """`module` itself, or where it is sharded (`state_dict` given) a plain module of its class
    holding the whole weights of its part of `state_dict` (the keys under `prefix.`, all without one)."""
    if state_dict is None:
        return module
    plain = plain_class(module).from_config(module.config)
    plain.load_state_dict({k.removeprefix(f"{prefix}."): v for k, v in state_dict.items()
                           if not prefix or k.startswith(f"{prefix}.")})
    return plain
