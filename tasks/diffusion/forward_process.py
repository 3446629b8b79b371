"""DiffusionNFT's units: a clean sample re-noised on the forward process (Zheng et al. 2025,
'DiffusionNFT: Online Diffusion Reinforcement with Forward Process'; docs/methods.md).

A unit is a (clean sample x0, noise level t) pair: x_t = (1 - t) x0 + t eps with fresh noise eps,
the flow family's forward process. With v the policy's velocity at x_t and v_old the old policy's,

    v+ = beta v + (1 - beta) v_old          (the implicit positive policy)
    v- = (1 + beta) v_old - beta v          (the implicit negative policy)
    x0(u) = x_t - t u                       (the clean sample a velocity u points to)
    L(u) = mean_d (x0(u) - x0)^2 / sg(mean_d |x0(u) - x0|)   (the authors' adaptive weight, clipped at 1e-5)

and the unit's positive and negative losses are L(v+) and L(v-) (`implicit_velocity_losses`);
the objective `nft` (mmrl/core/objectives.py) weighs them by the normalised reward.
"""

from __future__ import annotations

from torch import Tensor

ADAPTIVE_WEIGHT_MIN = 1e-5  # the authors' clip of the adaptive weight


def renoised(x0: Tensor, noise: Tensor, t: Tensor) -> Tensor:
    """x_t = (1 - t) x0 + t eps, `t` [B] broadcast over the sample's dimensions."""
    t = t.view(-1, *([1] * (x0.dim() - 1)))
    return (1 - t) * x0 + t * noise


def adaptive_denoising_loss(x0_pred: Tensor, x0: Tensor) -> Tensor:
    """mean_d (x0_pred - x0)^2 / sg(max(mean_d |x0_pred - x0|, 1e-5)) per row [B], in fp32."""
    diff = x0_pred.float() - x0.float()
    scale = diff.detach().abs().flatten(1).mean(1).clamp(min=ADAPTIVE_WEIGHT_MIN)
    return diff.pow(2).flatten(1).mean(1) / scale


def implicit_velocity_losses(v: Tensor, v_old: Tensor, xt: Tensor, x0: Tensor, t: Tensor,
                             beta: float) -> tuple[Tensor, Tensor]:
    """(L(v+), L(v-)) per row [B] for velocities at x_t (module docstring); `v_old` is detached."""
    v, v_old = v.float(), v_old.detach().float()
    t = t.float().view(-1, *([1] * (xt.dim() - 1)))
    positive = beta * v + (1 - beta) * v_old
    negative = (1 + beta) * v_old - beta * v
    return (adaptive_denoising_loss(xt.float() - t * positive, x0),
            adaptive_denoising_loss(xt.float() - t * negative, x0))
