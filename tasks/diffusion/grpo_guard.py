"""GRPO-Guard's per-step scales (Wang et al. 2025, 'GRPO-Guard: Mitigating Implicit Over-Optimization
in Flow Matching via Regulated Clipping'; the authors' train_sd3_GRPO_Guard.py with rationorm).

For a Gaussian SDE step of std s = sigma_t sqrt(|dt|) the log-ratio l = log pi_theta - log pi_old
(mean over dims) has a mean below 0 and a spread that grows as s shrinks. GRPO-Guard takes

    rho = exp((l + mean_d (mu_theta - mu_old)^2 / (2 s^2)) s)

(its mean-shift term is 0 with one update pass, the old mean being the current one) and divides
each step's clipped surrogate by |dt|, so that every step weighs alike in the gradient.
`guard_step_scales` gives (s, 1 / |dt|) for one step, `batch_scales` for every row and step of a
batch of rollouts (the adapter's `step_scales`); `algorithm.ratio_norm: grpo_guard` applies them
(mmrl/core/objectives.py, policy_loss).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mmrl.core.rollout import Rollout

from .samplers import SAMPLERS

GUARD_SAMPLERS = ("flow_sde", "dance")  # Gaussian SDE steps whose std is sigma_t sqrt(|dt|)


def guard_step_scales(sampler: str, s: float, s_next: float, strength: float) -> tuple[float, float]:
    """(the step's std, 1 / |dt|) of the step from level s to s_next."""
    if sampler not in GUARD_SAMPLERS:
        raise ValueError(f"algorithm.ratio_norm=grpo_guard needs policy.sampler in {GUARD_SAMPLERS}, not {sampler!r}")
    _, std = SAMPLERS.get(sampler)(torch.zeros(1), torch.zeros(1), s, s_next, strength)
    return std, 1.0 / abs(s_next - s)


def scales_problem(cfg: Any) -> str | None:
    """Why settings `cfg` (a `DiffusionConfig`) give no step scales (None: they do)."""
    if cfg.sampler in GUARD_SAMPLERS and cfg.units == "steps":
        return None
    return (f"GRPO-Guard's step scales are those of the Gaussian SDE steps {GUARD_SAMPLERS} "
            f"(policy.sampler={cfg.sampler!r}, policy.units={cfg.units!r})")


def batch_scales(batch: Rollout, units: slice, sampler: str, strength: float) -> tuple[Tensor, Tensor]:
    """(step std, 1 / |dt|) [B, u] of the batch's units in `units`, from its levels."""
    levels = batch.extras["levels"][0].tolist()
    ks = list(range(batch.num_units))[units]
    scales = torch.tensor([guard_step_scales(sampler, levels[k], levels[k + 1], strength) for k in ks],
                          dtype=torch.float32)
    return scales[:, 0].expand(len(batch), -1), scales[:, 1].expand(len(batch), -1)
