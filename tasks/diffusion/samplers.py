"""One denoising step as a Gaussian policy: x_next ~ N(mean, std^2 I) (docs/methods.md, 'Text-to-image').

Flow matching (diffusers' convention): x_s = (1 - s) x0 + s eps, the model predicts v = eps - x0,
a step goes from level s to s_next < s with dt = s_next - s. DDPM models (SD 1.5) predict eps and
the levels are cumulative alphas ab. Every sampler maps (x, prediction, level, next level,
strength) to (mean, std); a step with std 0 is deterministic (an ODE step) and has no log-prob.

    flow_sde  (Flow-GRPO)  sigma = a sqrt(s / (1 - s)),  mean = x + [v + sigma^2 / (2 s) (x + (1 - s) v)] dt,
                           std = sigma sqrt(-dt)   (at s = 1 the ratio uses s_next: flow_grpo's sigma_max)
    dance     (DanceGRPO)  std = eta sqrt(-dt),  mean = x + v dt - eta^2 / 2 * score * dt,
                           score = -(x + (1 - s) v) / s
    cps       (Coefficient-preserving sampling)  std = s_next sin(a pi / 2),
                           mean = x0 (1 - s_next) + x1 sqrt(s_next^2 - std^2),  x0 = x - s v,  x1 = x + (1 - s) v
    ode       (Euler)      mean = x + v dt, std = 0
    ddim      (DDIM, eps models)  x0 = (x - sqrt(1 - ab) eps) / sqrt(ab),
                           std = eta sqrt((1 - ab') / (1 - ab) (1 - ab / ab')),
                           mean = sqrt(ab') x0 + sqrt(1 - ab' - std^2) eps
At strength 0 flow_sde, dance and cps reduce to the Euler ODE step and ddim to deterministic DDIM.
"""

from __future__ import annotations

import math
from typing import Callable

from torch import Tensor

from mmrl.registry import Registry

StepFn = Callable[[Tensor, Tensor, float, float, float], "tuple[Tensor, float]"]
SAMPLERS: Registry[StepFn] = Registry("diffusion sampler")
EPS_SAMPLERS = ("ddim",)  # samplers for eps-predicting DDPM models; the others are flow samplers


@SAMPLERS.register("flow_sde")
def flow_sde(x: Tensor, v: Tensor, s: float, s_next: float, a: float) -> tuple[Tensor, float]:
    dt = s_next - s
    sigma = a * math.sqrt(s / (1 - (s if s < 1 else s_next)))
    mean = x + (v + sigma ** 2 / (2 * s) * (x + (1 - s) * v)) * dt
    return mean, sigma * math.sqrt(-dt)


@SAMPLERS.register("dance")
def dance(x: Tensor, v: Tensor, s: float, s_next: float, eta: float) -> tuple[Tensor, float]:
    dt = s_next - s
    score = -(x + (1 - s) * v) / s
    mean = x + v * dt - 0.5 * eta ** 2 * score * dt
    return mean, eta * math.sqrt(-dt)


@SAMPLERS.register("cps")
def cps(x: Tensor, v: Tensor, s: float, s_next: float, a: float) -> tuple[Tensor, float]:
    std = s_next * math.sin(a * math.pi / 2)
    x0, x1 = x - s * v, x + (1 - s) * v
    return x0 * (1 - s_next) + x1 * math.sqrt(max(s_next ** 2 - std ** 2, 0.0)), std


@SAMPLERS.register("ode")
def ode(x: Tensor, v: Tensor, s: float, s_next: float, strength: float = 0.0) -> tuple[Tensor, float]:
    return x + (s_next - s) * v, 0.0


@SAMPLERS.register("ddim")
def ddim(x: Tensor, eps: Tensor, ab: float, ab_next: float, eta: float) -> tuple[Tensor, float]:
    x0 = (x - math.sqrt(1 - ab) * eps) / math.sqrt(ab)
    std = eta * math.sqrt((1 - ab_next) / (1 - ab) * (1 - ab / ab_next))
    return math.sqrt(ab_next) * x0 + math.sqrt(max(1 - ab_next - std ** 2, 0.0)) * eps, std


def gaussian_logprob(sample: Tensor, mean: Tensor, std: float) -> Tensor:
    """log N(sample; mean, std^2 I) in fp32, the MEAN over every dimension but the first ([B])."""
    if std <= 0:
        raise ValueError("a deterministic step (std 0) has no log-prob; it cannot be a trained step")
    d = sample.float() - mean.float()
    logp = -d.pow(2) / (2 * std ** 2) - math.log(std) - 0.5 * math.log(2 * math.pi)
    return logp.flatten(1).mean(1)


def cps_authors_logprob(sample: Tensor, mean: Tensor, std: float) -> Tensor:
    """Flow-GRPO's CPS log-prob ('remove all constants'): -(sample - mean)^2, fp32, mean over every
    dimension but the first. It is 2 std^2 times the Gaussian log-density plus a constant, so the
    PPO ratio it gives is the true ratio to the power 2 std^2 (std = s_next sin(a pi / 2) < 1: a
    ratio nearer 1, on which the clip range acts)."""
    if std <= 0:
        raise ValueError("a deterministic step (std 0) has no log-prob; it cannot be a trained step")
    return -(sample.float() - mean.float()).pow(2).flatten(1).mean(1)


LOGPROB_FORMS = {"gaussian": gaussian_logprob, "authors": cps_authors_logprob}
KL_FORMS = ("exact", "flow_grpo", "velocity_mse")


def flow_grpo_kl_factor(sampler: str, s: float, s_next: float) -> float:
    """Flow-GRPO's KL / the exact KL for one step: its training script divides ||mu - mu_ref||^2
    by 2 sigma_t^2 with the std_dev_t its step returns, sigma_t = a sqrt(s / (1 - s)) for the
    Flow-GRPO SDE (the step std is sigma_t sqrt(|dt|), so the factor is |dt|) and the step std
    itself for CPS (factor 1)."""
    if sampler == "flow_sde":
        return abs(s_next - s)
    if sampler == "cps":
        return 1.0
    raise ValueError(f"policy.kl_form=flow_grpo is Flow-GRPO's KL for the samplers flow_sde and cps, "
                     f"not {sampler!r}; use policy.kl_form=exact")


def velocity_mse(velocity: Tensor, ref_velocity: Tensor) -> Tensor:
    """UniGRPO's regulariser in place of the step KL: mean_d (v_theta - v_ref)^2 [B], fp32, the mean over
    every dimension but the first of the squared difference of the two velocity predictions (UniRL's BAGEL
    UniGRPO: ((v_theta - v_ref) ** 2).mean() per step, one sample per micro-batch)."""
    return (velocity.float() - ref_velocity.float()).pow(2).flatten(1).mean(1)


def gaussian_mean_kl(mean: Tensor, ref_mean: Tensor, std: float) -> Tensor:
    """KL(N(mean, std^2) || N(ref_mean, std^2)) = ||mean - ref_mean||^2 / (2 std^2) (exact; Flow-GRPO's
    script uses |dt| times this for its SDE, `flow_grpo_kl_factor`),
    fp32, mean over every dimension but the first ([B]), the normalisation of the log-probs."""
    return ((mean.float() - ref_mean.float()).pow(2) / (2 * std ** 2)).flatten(1).mean(1)
