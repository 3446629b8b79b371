"""Loading a model, shared by the adapters: the weights' dtypes, the registry of tiny models
(`tiny:NAME`, filled by `tasks.demos`), and for the token adapters (causal_lm, the multimodal
ones, dlm) the tokenizer and its left padding."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from transformers import AutoTokenizer

from mmrl.registry import Registry

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# `policy.model: tiny:NAME` -> fn(**policy.tiny_args) building a tiny random model in memory (no
# download): (model, tokenizer or processor) for the token adapters, a pipeline for diffusion
TINY_MODELS: Registry[Callable[..., Any]] = Registry("tiny model")


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
