"""How a trained denoiser is written, in the formats the diffusers ecosystem loads. A LoRA: the
PEFT adapter of the denoiser, and the same weights in the diffusers LoRA format
(`pytorch_lora_weights.safetensors`, rank and alpha in its metadata), so that
`pipe.load_lora_weights(path)` on the stock pipeline applies it (pipelines without diffusers LoRA
support keep PEFT's alone). Full weights: the whole pipeline with the trained denoiser in place,
loadable by `DiffusionPipeline.from_pretrained(path)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from torch import Tensor, nn


def save_denoiser(pipe: Any, denoiser: nn.Module, model: nn.Module, path: Path,
                    state_dict: dict[str, Tensor] | None, plain_class: Callable[[nn.Module], type]) -> None:
    """Write `model`, the trained `denoiser` of `pipe` (`Policy.save_pretrained`); `state_dict`: the
    whole weights of a sharded `model`, loaded into a plain module of `plain_class(model)`."""
    name = next(k for k, v in pipe.components.items() if v is denoiser)
    if hasattr(model, "peft_config"):
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
        if hasattr(pipe, "save_lora_weights"):  # pipelines without diffusers LoRA support keep PEFT's
            from peft.utils import get_peft_model_state_dict
            layers = {k.removeprefix("base_model.model."): v
                      for k, v in get_peft_model_state_dict(model, state_dict=state_dict).items()}
            pipe.save_lora_weights(path, **{f"{name}_lora_layers": layers,
                                            f"{name}_lora_adapter_metadata":
                                                model.peft_config[model.active_adapter].to_dict()})
        return
    if state_dict is not None:  # sharded: a plain denoiser of the same class holding the whole weights
        model = plain_class(model).from_config(model.config)
        model.load_state_dict(state_dict)
    type(pipe)(**{**pipe.components, name: model}).save_pretrained(path, safe_serialization=True)
