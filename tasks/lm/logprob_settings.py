"""The log-prob settings every token family declares (`causal_lm` and the multimodal adapters,
`dlm`): where log-probs come from (`logprobs_from`, `logprob_chunk_tokens`) and the first
micro-batch's check (`logprob_check`, `logprob_check_tolerance`); and, from them, the output
head a log-prob pass goes through (None: the logits path) and the check's tolerance."""

from __future__ import annotations

import logging
from dataclasses import field
from typing import Any

import torch
from torch import nn

from mmrl.core.parallel import ParallelView

from .generation import warn_once
from .output_head import OutputHead

LOGPROB_SOURCES = ("hidden_states", "logits")


def logprobs_from_field(default: str = "hidden_states", note: str = "") -> Any:
    return field(default=default, metadata={"help": (
        "Where log-probs come from: hidden_states (the model runs without its output head, which projects the "
        "scored positions' hidden states a chunk of tokens at a time in the forward and the backward, so the "
        "logits are never whole), or logits (the model's logits, log-softmax a chunk of rows at a time). Models the "
        "first cannot serve (logit soft-capping, a LoRA output head with sharded parameters, shards offloaded to "
        "the CPU by distributed.offload on an accelerator) take the second, with a warning. Under a strategy that "
        "shards parameters (see docs/distributed.md), the sharded output head's weight is gathered whole for the "
        "log-probs' forward and again for their backward, and its gradient averaged into the shards." + note)})


def logprob_chunk_tokens_field() -> Any:
    return field(default=1024, metadata={"help": (
        "Tokens per chunk of logits with logprobs_from hidden_states: at most this many tokens' logits exist at a "
        "time (memory bound, not a numeric setting).")})


def logprob_check_field() -> Any:
    return field(default=True, metadata={"help": (
        "With logprobs_from hidden_states, compare its log-probs with the model's logits on the run's first "
        "micro-batch (max |logp difference| and the KL between the two, logged) and stop beyond "
        "logprob_check_tolerance.")})


def logprob_check_tolerance_field() -> Any:
    return field(default=None, metadata={"help": (
        "The largest difference logprob_check accepts; null: 1e-4 for a float32 output head, 0.5 for a 16-bit one "
        "(the two paths may round a bfloat16 logit differently: one step is 0.25 at a logit of 32-64).")})


def logprob_setting_problems(cfg: Any) -> list[str]:
    """What is wrong with a policy config's log-prob settings."""
    problems = []
    if cfg.logprobs_from not in LOGPROB_SOURCES:
        problems.append(f"policy.logprobs_from={cfg.logprobs_from!r} is not one of {', '.join(LOGPROB_SOURCES)}")
    if cfg.logprob_chunk_tokens < 1:
        problems.append(f"policy.logprob_chunk_tokens={cfg.logprob_chunk_tokens} must be at least 1")
    if cfg.logprob_check_tolerance is not None and not cfg.logprob_check_tolerance > 0:
        problems.append(f"policy.logprob_check_tolerance={cfg.logprob_check_tolerance} must be > 0 (null: by dtype)")
    return problems


def output_head_for(model: nn.Module, cfg: Any, parallel: ParallelView, log: logging.Logger) -> OutputHead | None:
    """The model's output head when log-probs come from the hidden states, else None (the logits
    path: `policy.logprobs_from: logits`, or a model or sharded head it cannot serve, warned once)."""
    if cfg.logprobs_from == "logits":
        return None
    reason = OutputHead.unsupported_reason(model)
    if reason is None and parallel.is_sharded(model):
        reason = parallel.whole_unavailable or OutputHead.sharded_reason(model)
    if reason is not None:
        warn_once(log, f"policy.logprobs_from=hidden_states: {reason}; log-probs use the model's logits")
        return None
    return OutputHead(model, parallel)


def check_tolerance(cfg: Any, head: OutputHead) -> float:
    """`policy.logprob_check_tolerance`, or by the head's dtype: fp32 paths agree to ~1e-6, while
    two bfloat16 projections of different shapes may round a logit one step apart (0.25 at a
    logit of 32-64); a broken path is off by whole nats."""
    if cfg.logprob_check_tolerance is not None:
        return cfg.logprob_check_tolerance
    return 1e-4 if head.compute_dtype == torch.float32 else 0.5
