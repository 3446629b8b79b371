"""The gap between the rollout sampler and the training forward, measured and corrected
(docs/methods.md, 'Rollout correction').

A rollout records the log-prob of each unit under the sampler that drew it
(`Rollout.rollout_logp`); the update computes the same units' old log-probs with the training
forward. Per unit, with rho = pi_old / pi_rollout = exp(old_logp - rollout_logp), detached:

    logp_diff = |old_logp - rollout_logp|                  (rollout/logp_diff_mean, _max)
    tis: w = min(rho, C)                                    (truncated importance sampling)
    mis: w = rho if rho <= C else 0                         (masked importance sampling)

and the unit's policy-gradient loss is multiplied by w (the regularisers are not), as TRL's
`vllm_importance_sampling_mode` token_truncate / token_mask and verl's token-level `rollout_is`
(Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL training';
Liu, Li et al. 2025, 'When speed kills stability'). A unit with rho > C is counted as capped
(rollout/capped_frac): truncated under tis, dropped under mis.

For rows drawn by older weights (docs/async.md) this is decoupled PPO: the clip is on
pi_theta / pi_old, pi_old the proximal weights' log-probs recomputed before the update, and the
behaviour log-probs recorded at generation only give the importance weight.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

CORRECTIONS = ("none", "tis", "mis")
# per-process sums over the trained units of a pass, gathered and turned into metrics by `mismatch_metrics`
SUM_KEYS = ("rollout_units", "rollout_diff_sum", "rollout_capped")
MAX_KEYS = ("rollout_diff_max",)


def importance_weights(old_logp: Tensor, rollout_logp: Tensor, kind: str, cap: float) -> tuple[Tensor, Tensor]:
    """(w [B, u], capped [B, u] bool) of `kind` (tis or mis) with cap C, from fp32 log-probs;
    w is detached (a weight on the loss, not a term to differentiate)."""
    if kind not in ("tis", "mis"):
        raise ValueError(f"algorithm.rollout_correction={kind!r} is not one of {CORRECTIONS}")
    rho = torch.exp(old_logp.detach().float() - rollout_logp.float())
    capped = rho > cap
    weight = rho.clamp(max=cap) if kind == "tis" else rho.masked_fill(capped, 0.0)
    return weight, capped


def mismatch_sums(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor,
                  capped: Tensor | None = None) -> dict[str, float]:
    """A micro-batch's contribution to the mismatch metrics over its units with mask > 0."""
    real = mask > 0
    diff = (old_logp.detach().float() - rollout_logp.float()).abs()[real]
    return {"rollout_units": float(real.sum()), "rollout_diff_sum": float(diff.sum()),
            "rollout_capped": float((capped & real).sum()) if capped is not None else 0.0,
            "rollout_diff_max": float(diff.max()) if diff.numel() else 0.0}


def add_sums(into: dict[str, float], sums: dict[str, float]) -> None:
    for key in SUM_KEYS:
        into[key] = into.get(key, 0.0) + sums[key]
    for key in MAX_KEYS:
        into[key] = max(into.get(key, 0.0), sums[key])


def mismatch_metrics(parts: list[dict[str, float]], kind: str) -> dict[str, float]:
    """The logged `rollout/*` metrics from every process's sums (empty when no process had
    rollout log-probs); `rollout/capped_frac` only with a correction on."""
    parts = [p for p in parts if "rollout_units" in p]
    if not parts:
        return {}
    units = sum(p["rollout_units"] for p in parts)
    out = {"rollout/logp_diff_mean": sum(p["rollout_diff_sum"] for p in parts) / units if units else math.nan,
           "rollout/logp_diff_max": max(p["rollout_diff_max"] for p in parts) if units else math.nan}
    if kind != "none":
        out["rollout/capped_frac"] = sum(p["rollout_capped"] for p in parts) / units if units else math.nan
    return out
