"""TP-GRPO step rewards (Tong et al., 'Alleviating Sparse Rewards by Modeling Step-Wise and
Long-Term Sampling Effects in Flow-Based GRPO', github.com/YunzeTong/TurningPoint-GRPO).

The states before, inside and after the trained (SDE) window, x_0 .. x_W, are each completed by
the ODE to an image and scored: R_0 .. R_W (R_0: the pure-ODE image from the same noise; R_W: the
final one). Step t's reward is its increment d_t = R_{t+1} - R_t; with the global trend
D = R_W - R_0, step t >= 1 is a turning point when sign(d_{t-1}) sign(D) < 0 and
sign(d_t) sign(D) > 0 (it flips the local trend back to the global one); step 0 is one when its
increment agrees with the rest of the trajectory, sign(d_0) sign(R_W - R_1) > 0. A turning point
gets the aggregated long-term reward R_W - R_t (bonus weight `eta` = 1) instead of d_t.
"""

from __future__ import annotations

import torch
from torch import Tensor


def turning_points(scores: Tensor) -> Tensor:
    """bool [N, W] from the scores R [N, W + 1] of the completed states."""
    d = scores[:, 1:] - scores[:, :-1]
    trend = torch.sign(scores[:, -1:] - scores[:, :1])
    out = torch.zeros_like(d, dtype=torch.bool)
    out[:, 1:] = (torch.sign(d[:, :-1]) * trend < 0) & (torch.sign(d[:, 1:]) * trend > 0)
    out[:, 0] = torch.sign(d[:, 0]) * torch.sign(scores[:, -1] - scores[:, 1]) > 0
    return out


def step_rewards(scores: Tensor, eta: float = 1.0) -> tuple[Tensor, Tensor]:
    """(step rewards [N, W], turning points [N, W]) from R [N, W + 1]:
    r_t = d_t, or eta (R_W - R_t) at a turning point."""
    if scores.dim() != 2 or scores.shape[1] < 2:
        raise ValueError(f"turning-point rewards need scores [N, W + 1] with W >= 1; got {tuple(scores.shape)}")
    d = scores[:, 1:] - scores[:, :-1]
    tp = turning_points(scores)
    aggregated = eta * (scores[:, -1:] - scores[:, :-1])
    return torch.where(tp, aggregated, d), tp
