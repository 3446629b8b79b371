"""Distribution matching distillation's signal (docs/methods.md, 'Distribution matching'): DMD2's
gradient on a few-step student's clean samples, from a frozen real score (the teacher) and a fake
score trained on the student's own samples, and the loss that carries it into the student.

For a student sample x [B, ...] re-noised at a level t, each score model's clean prediction
x0_real, x0_fake [B, ...] gives (Yin et al. 2024, DMD2, in the authors' code's form)
    p_real = x - x0_real,  p_fake = x - x0_fake
    g      = (p_real - p_fake) / mean_d |p_real|      (per row; nan_to_num, as the authors')
    loss   = 0.5 mean_d (x - sg(x - g))^2              d loss / d x = g / D
so a step of gradient descent on the loss moves x along -g, towards the real distribution. A fake
score equal to the real one gives g = 0. The levels t are uniform (DMD2) or drawn from DMDR's
cosine-decayed Beta (its dynamic renoise sampling, `beta_schedule`, `beta_levels`). DMDR's dynamic
distribution guidance asks the real score with weights real + m (fake - real), m cosine-decayed to 0
(`guidance_mix`, `blend_weights`): Flow-Factory's real score, the fake score's LoRA at a decaying scale.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def dmd_gradient(sample: Tensor, real_clean: Tensor, fake_clean: Tensor) -> Tensor:
    """DMD2's normalised gradient g [B, ...] (fp32, no grad) at the student's samples `sample` from the
    real and the fake score's clean predictions of their re-noised versions (module docstring)."""
    x = sample.detach().float()
    p_real, p_fake = x - real_clean.detach().float(), x - fake_clean.detach().float()
    scale = p_real.abs().flatten(1).mean(1).view(-1, *([1] * (x.dim() - 1)))
    return torch.nan_to_num((p_real - p_fake) / scale)


def dmd_loss(sample: Tensor, gradient: Tensor) -> Tensor:
    """0.5 mean_d (x - sg(x - g))^2 per row [B] (fp32): its gradient in x is g / D, D the sample's
    size (DMD2's `loss_dm`, per row: the authors' batch mean is the mean of these)."""
    x = sample.float()
    return 0.5 * (x - (x - gradient.float()).detach()).pow(2).flatten(1).mean(1)


def noise_levels(n: int, low: float, high: float, generator: torch.Generator) -> Tensor:
    """n levels [n] (fp32) drawn uniformly in [low, high]: where the student's samples are re-noised
    (DMD2's timesteps between min_step_percent and max_step_percent of the schedule)."""
    return low + (high - low) * torch.rand(n, generator=generator)


def cosine_decay(step: int, decay_steps: int) -> float:
    """(1 + cos(pi min(step / decay_steps, 1))) / 2: 1 at step 0, 0 from `decay_steps` on (decay_steps > 0)."""
    return 0.5 * (1.0 + math.cos(min(step / decay_steps, 1.0) * math.pi))


def beta_schedule(alpha: float, beta: float, step: int, decay_steps: int) -> tuple[float, float]:
    """DMDR's dynamic renoise sampling: the Beta(a, b) the levels are drawn from at student step `step`,
    a = 1 + (alpha - 1) c, b = 1 + (beta - 1) c, c = (1 + cos(pi min(step / decay_steps, 1))) / 2: from
    Beta(alpha, beta) (high noise first with alpha > beta) to the uniform Beta(1, 1) after `decay_steps`
    steps; `decay_steps` 0 keeps Beta(alpha, beta)."""
    if decay_steps <= 0:
        return alpha, beta
    c = cosine_decay(step, decay_steps)
    return 1.0 + (alpha - 1.0) * c, 1.0 + (beta - 1.0) * c


def beta_levels(n: int, low: float, high: float, shape: tuple[float, float], generator: torch.Generator) -> Tensor:
    """n levels [n] (fp32) low + (high - low) t, t ~ Beta(shape) drawn from a seed that `generator` gives
    (torch's Beta sampler takes no generator; under the same global seed these are its draws)."""
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        t = torch.distributions.Beta(torch.tensor(float(shape[0])), torch.tensor(float(shape[1]))).sample((n,))
    return low + (high - low) * t.float()


def guidance_mix(scale: float, step: int, decay_steps: int) -> float:
    """DMDR's dynamic distribution guidance: the fake score's share m of the real score's weights at student
    step `step`, scale cosine_decay(step, decay_steps); 0 with decay_steps 0 (Flow-Factory's lora_scale_r
    schedule, which gives 0 when its dynamic_step is 0)."""
    return scale * cosine_decay(step, decay_steps) if decay_steps > 0 else 0.0


@torch.no_grad()
def blend_weights(target: nn.Module, real: nn.Module, fake: nn.Module, mix: float) -> None:
    """Set `target`'s floating parameters and buffers to real + mix (fake - real) (torch.lerp, in each
    tensor's dtype), its other buffers to the real score's; the three modules share one architecture."""
    real_state, fake_state = real.state_dict(), fake.state_dict()
    for name, out in target.state_dict().items():
        r, f = real_state[name], fake_state[name]
        out.copy_(torch.lerp(r, f.to(r.dtype), mix) if r.is_floating_point() else r)
