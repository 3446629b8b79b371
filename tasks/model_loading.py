"""Loading a model, shared by the adapters: the weights' dtypes, the registry of tiny models
(`tiny:NAME`, filled by `tasks.demos`), for the token adapters (causal_lm, the multimodal ones, dlm)
the tokenizer and its left padding, and models built without their weights.

`weightless()` builds a model without its memory (for planning a recipe's memory before any
download: `mmrl plan`, mmrl/experiments/memory_plan.py): inside it every module's
parameters and buffers are made on the meta device (shapes and dtypes, no memory), and
`pretrained(...)` builds a model from its configuration (a local path's config.json, or a hub id's,
downloaded alone) instead of reading its weights. Everything else (tokenizers, processors,
schedulers, the tensors an adapter makes outside its modules) is made as usual."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer

from mmrl.registry import Registry

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# `policy.model: tiny:NAME` -> fn(**policy.tiny_args) building a tiny random model in memory (no
# download): (model, tokenizer or processor) for the token adapters, a pipeline for diffusion
TINY_MODELS: Registry[Callable[..., Any]] = Registry("tiny model")


_WEIGHTLESS = contextvars.ContextVar("weightless", default=False)


@contextmanager
def weightless() -> Iterator[None]:
    """Modules made inside hold their parameters and buffers on the meta device; `pretrained` builds
    from the configuration alone (module docstring)."""
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def meta_parameter(module, name, param):
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register_parameter(module, name, param)

    def meta_buffer(module, name, tensor, persistent=True):
        register_buffer(module, name, tensor.to("meta") if tensor is not None else None, persistent)

    token = _WEIGHTLESS.set(True)
    nn.Module.register_parameter, nn.Module.register_buffer = meta_parameter, meta_buffer
    try:
        yield
    finally:
        nn.Module.register_parameter, nn.Module.register_buffer = register_parameter, register_buffer
        _WEIGHTLESS.reset(token)


def is_weightless() -> bool:
    """Inside `weightless()`."""
    return _WEIGHTLESS.get()


def model_configuration(path: str, trust_remote_code: bool = False) -> Any:
    """The transformers configuration of a local path or a hub id (its config.json alone)."""
    return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)


def pretrained(model_class: Any, path: str, **kwargs: Any) -> nn.Module:
    """`model_class.from_pretrained(path, **kwargs)`; inside `weightless()` the model its configuration
    describes (`config=` when given, else `path`'s), its weights on the meta device."""
    if not is_weightless():
        return model_class.from_pretrained(path, **kwargs)
    config = kwargs.pop("config", None) or model_configuration(path, kwargs.get("trust_remote_code", False))
    build = model_class.from_config if hasattr(model_class, "from_config") else model_class._from_config
    return build(config, **{k: v for k, v in kwargs.items() if k in ("dtype", "attn_implementation",
                                                                     "trust_remote_code")})


def load_tiny(model: str, tiny_args: dict[str, Any], dtype: str,
              attn_implementation: str | None = None) -> tuple[nn.Module, Any]:
    """The registered tiny model ``tiny:NAME`` (built from `tiny_args`) in `dtype`, with its tokenizer;
    with `attn_implementation`, set to that transformers attention implementation (as from_pretrained's)."""
    module, tokenizer = TINY_MODELS.get(model.removeprefix("tiny:"))(**tiny_args)
    if attn_implementation is not None:
        module.set_attn_implementation(attn_implementation)
    return module.to(DTYPES[dtype]), tokenizer


def load_tokenizer(cfg: Any) -> Any:
    """The tokenizer of an adapter `Config` with `tokenizer`, `model` and `trust_remote_code`
    (`cfg.tokenizer`, or the model's when null)."""
    return AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)


def load_tokenizer_only(cfg: Any) -> Any:
    """The tokenizer of an adapter `Config` without the model's weights (a ``tiny:`` model is
    built with its tokenizer: it has no weights to load)."""
    if cfg.model.startswith("tiny:"):
        return load_tiny(cfg.model, cfg.tiny_args, "float32")[1]
    return load_tokenizer(cfg)


def pad_on_the_left(tokenizer: Any) -> None:
    """Batches of prompts padded on the left (so completions start at one column), with the eos
    token as padding where the tokenizer has no pad token."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
