"""Loading a transformers model and its tokenizer, shared by the token adapters (causal_lm,
the multimodal ones, dlm): the weights' dtypes, the registered tiny models, the tokenizer and
its left padding."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoTokenizer

from .tiny_models import TINY_MODELS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tiny(model: str, tiny_args: dict[str, Any], dtype: str) -> tuple[nn.Module, Any]:
    """The registered tiny model ``tiny:NAME`` (built from `tiny_args`) in `dtype`, with its tokenizer."""
    module, tokenizer = TINY_MODELS.get(model.removeprefix("tiny:"))(**tiny_args)
    return module.to(DTYPES[dtype]), tokenizer


def load_tokenizer(cfg: Any) -> Any:
    """The tokenizer of an adapter `Config` with `tokenizer`, `model` and `trust_remote_code`
    (`cfg.tokenizer`, or the model's when null)."""
    return AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)


def pad_on_the_left(tokenizer: Any) -> None:
    """Batches of prompts padded on the left (so completions start at one column), with the eos
    token as padding where the tokenizer has no pad token."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
