"""`policy.logprob_check`: the log-probs taken from the hidden states against the model's own
logits, once, on the run's first micro-batch (on each process), before they train anything.

Fused log-prob kernels have failed silently elsewhere (verl #2656: log-probs above 0 collapsed the
rewards). The check compares the two paths on the same micro-batch and stops the run beyond the
tolerance, naming `policy.logprobs_from: logits` as the way round. It reports the largest
|difference| of a token's log-prob and the difference of the KL the loss would see: the mean k3
estimate KL(hidden-state path || logits path) per token, 0 when the paths agree.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from mmrl.errors import UserError


def path_differences(fused: Tensor, plain: Tensor, mask: Tensor) -> dict[str, float]:
    """max |fused - plain| of the log-probs [B, C] at the mask's tokens, the mean k3 KL between
    the two, and the largest log-prob of the fused path (a log-prob above 0 is a broken path)."""
    valid = mask.bool()
    if not valid.any():
        return {"max_logp_diff": 0.0, "kl": 0.0, "max_logp": 0.0}
    delta = (plain - fused)[valid]
    kl = (torch.exp(delta) - delta - 1).mean()
    return {"max_logp_diff": float(delta.abs().max()), "kl": float(kl), "max_logp": float(fused[valid].max())}


def compare_paths(fused: Tensor, plain: Tensor, mask: Tensor, tolerance: float, log: logging.Logger) -> dict[str, float]:
    """Log the differences of the two paths; raise `UserError` when a log-prob or the KL is
    further apart than `tolerance`, or a log-prob of the fused path is above 0."""
    diff = path_differences(fused, plain, mask)
    log.info("policy.logprob_check: log-probs from the hidden states against the logits on the first micro-batch: "
             "max |logp difference| %.3g, KL %.3g (tolerance %.3g)", diff["max_logp_diff"], diff["kl"], tolerance)
    if diff["max_logp_diff"] > tolerance or abs(diff["kl"]) > tolerance or diff["max_logp"] > tolerance:
        raise UserError(
            f"policy.logprob_check: the log-probs taken from the hidden states differ from the model's logits on the "
            f"first micro-batch (max |logp difference| {diff['max_logp_diff']:.3g}, KL {diff['kl']:.3g}, largest logp "
            f"{diff['max_logp']:.3g}; tolerance {tolerance:.3g}); set policy.logprobs_from: logits (and report the "
            f"model), or policy.logprob_check_tolerance if the difference is expected")
    return diff
