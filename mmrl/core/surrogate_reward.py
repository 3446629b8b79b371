"""TDM-R1's surrogate per-step reward (Luo et al. 2026, arXiv 2603.07700; docs/methods.md, 'TDM-R1'):
RL for a deterministic few-step student with a non-differentiable reward, in two decoupled parts.

1. The surrogate reward learns from the rewards. A trainable copy of the frozen reference (the
   teacher) is fitted, at every boundary x_k of the student's deterministic trajectory (whose final
   sample the reward scored, so each x_k carries that reward), by a group preference on the
   denoising errors of x_k re-noised at a level t, shared by every model asked of that boundary:
       e_i      = mean_d (v_target - v_sur(x_t))^2,  e_ref_i = the same of the reference      [B]
       l_g      = sum_{i in g} A_i beta (e_i - e_ref_i) / G          (detached; G the group size)
       pref     = mean_i sigmoid(l_{g(i)}) A_i e_i                    (the sigmoid detached)
       loss_k   = w_k (pref + ref_beta mean_i (e_i - e_ref_i)^2),    w_k = (k + 1) / K
   so a row with A_i > 0 lowers its denoising error (raises its density under the surrogate), one with
   A_i < 0 raises it, less as its group already agrees. Two stops keep the surrogate near its start:
   the trust region (e_i detached where exp(e_slow_i - e_i) left 1 +- clip in the advantage's
   direction, e_slow from a slowly moving copy of the surrogate) and the runaway stop (e_i detached
   where it moved in the advantage's direction and (e_i - e_ref_i)^2 > threshold).
2. The student follows the surrogate's reward. At each boundary, from the re-noised student clean
   prediction, the surrogate's and the reference's clean predictions x0_sur, x0_ref give the
   direction x0_sur - x0_ref (what the surrogate learned beyond the reference), and the reference's
   guided and conditional ones the guidance reward s_r / (s - 1) (x0_guided - x0_cond); each is a
   revised-target loss on the student's clean prediction x:
       revised(x, c, r) = mean_i [mean_d 0.5 (x - sg(x + c))^2] / max(mean_d |sg(x) - r|, eps)
   whose gradient in x is -c / (D max(...)) per row and batch mean, and the student's loss is
       tdm + tdm_weight revised(x, guidance, x0_ref) + (1 - tdm_weight) revised(x, x0_sur - x0_ref, x0_sur).
A surrogate equal to the reference gives the student no reward signal (its direction is 0), and
zero advantages give the surrogate no preference gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

_EPS = 1e-6  # the revised loss's lower clamp on its normaliser (the authors' trainer's)


def _rows(x: Tensor) -> Tensor:
    """Per-row mean over every dimension but the first: [B, ...] -> [B] (fp32)."""
    return x.float().flatten(1).mean(1)


def denoising_errors(target_velocity: Tensor, velocity: Tensor) -> Tensor:
    """A model's denoising error per row [B] (fp32): mean_d (v_target - v)^2, v [B, ...] its velocity
    at the re-noised boundary and v_target = noise - clean the flow's target; lower is likelier."""
    return _rows((target_velocity.float() - velocity.float()).pow(2))


def group_logits(errors: Tensor, reference_errors: Tensor, advantages: Tensor, group_index: Tensor,
                 group_size: int, beta: float) -> Tensor:
    """Each row's group preference logit [B] (detached): l_g = sum_{i in g} A_i beta (e_i - e_ref_i) / G
    for the group g of the row, `group_index` [B] its group (0..n_groups-1)."""
    per_row = advantages.float() * beta * (errors.detach().float() - reference_errors.float()) / group_size
    n_groups = int(group_index.max()) + 1
    sums = torch.zeros(n_groups, dtype=per_row.dtype, device=per_row.device).index_add_(0, group_index, per_row)
    return sums[group_index]


def group_preference_loss(errors: Tensor, reference_errors: Tensor, advantages: Tensor, group_index: Tensor,
                          group_size: int, beta: float) -> Tensor:
    """The surrogate's preference loss (scalar, fp32): mean_i sigmoid(l_g(i)) A_i e_i, the sigmoid
    detached, so d loss / d e_i = sigmoid(l_g(i)) A_i / B (module docstring)."""
    weights = torch.sigmoid(group_logits(errors, reference_errors, advantages, group_index, group_size, beta))
    return (weights * advantages.float() * errors.float()).mean()


def past_trust_region(errors: Tensor, slow_errors: Tensor, advantages: Tensor, clip: float) -> Tensor:
    """Rows [B] (bool) that moved past the trust region since the slow copy: ratio = exp(e_slow - e)
    above 1 + clip for A > 0, below 1 - clip for A <= 0; none when clip is 0."""
    if clip == 0.0:
        return torch.zeros(errors.shape, dtype=torch.bool, device=errors.device)
    ratio = torch.exp(slow_errors.detach().float() - errors.detach().float())
    return torch.where(advantages > 0, ratio > 1.0 + clip, ratio < 1.0 - clip)


def runaway(errors: Tensor, reference_errors: Tensor, advantages: Tensor, threshold: float) -> Tensor:
    """Rows [B] (bool) already moved in their advantage's direction (lower error for A > 0, higher for
    A <= 0) by more than `threshold` in (e - e_ref)^2."""
    e, ref = errors.detach().float(), reference_errors.float()
    moved = torch.where(advantages > 0, e < ref, e > ref)
    return moved & ((e - ref).pow(2) > threshold)


def trust_region_stop(errors: Tensor, slow_errors: Tensor, advantages: Tensor, clip: float) -> Tensor:
    """`errors` [B] detached on the rows past the trust region (`past_trust_region`)."""
    return torch.where(past_trust_region(errors, slow_errors, advantages, clip), errors.detach(), errors)


def runaway_stop(errors: Tensor, reference_errors: Tensor, advantages: Tensor, threshold: float) -> Tensor:
    """`errors` [B] detached on the runaway rows (`runaway`)."""
    return torch.where(runaway(errors, reference_errors, advantages, threshold), errors.detach(), errors)


def boundary_weight(boundary: int, steps: int) -> float:
    """The weight of trajectory boundary `boundary` (1..K, K = `steps`, K the final sample): (k + 1) / K,
    the later boundaries, nearer the scored sample, weighing more (the authors' trainer's ramp)."""
    return (boundary + 1) / steps


def surrogate_coefficients(errors: Tensor, reference_errors: Tensor, slow_errors: Tensor | None,
                           advantages: Tensor, group_index: Tensor, group_size: int,
                           settings: dict[str, float]) -> Tensor:
    """The detached coefficient c_i = sigmoid(l_g(i)) A_i [B] of each row's error in the preference
    term, 0 on the stopped rows, so that `surrogate_loss` = mean_i (c_i e_i + reference_beta
    (e_i - e_ref_i)^2) in its gradient: from errors taken without grad, the loss of any
    micro-batch of rows is then exact however the batch is split."""
    stopped = runaway(errors, reference_errors, advantages, settings["threshold"])
    if slow_errors is not None:
        stopped = stopped | past_trust_region(errors, slow_errors, advantages, settings["clip"])
    weights = torch.sigmoid(group_logits(errors, reference_errors, advantages, group_index, group_size,
                                         settings["beta"]))
    return torch.where(stopped, torch.zeros_like(weights), weights * advantages.float())


def surrogate_loss(errors: Tensor, reference_errors: Tensor, slow_errors: Tensor | None, advantages: Tensor,
                   group_index: Tensor, group_size: int, settings: dict[str, float]) -> Tensor:
    """The surrogate's loss at one boundary, before its boundary weight (scalar, fp32): the group
    preference on the trust-region- and runaway-stopped errors plus `reference_beta` times the mean
    (e - e_ref)^2. `settings`: beta, reference_beta, threshold, clip (module docstring, part 1);
    `slow_errors` [B] the slow copy's errors (None: no trust region)."""
    kept = errors if slow_errors is None else trust_region_stop(errors, slow_errors, advantages, settings["clip"])
    kept = runaway_stop(kept, reference_errors, advantages, settings["threshold"])
    preference = group_preference_loss(kept, reference_errors, advantages, group_index, group_size,
                                       settings["beta"])
    anchor = (errors.float() - reference_errors.float()).pow(2).mean()
    return preference + settings["reference_beta"] * anchor


def revised_target_loss(clean: Tensor, correction: Tensor, normaliser_reference: Tensor,
                        huber_c: float | None = None) -> Tensor:
    """The student's clean prediction `clean` [B, ...] regressed towards sg(clean + correction), per
    row [B] (fp32; the authors' loss is their batch mean): mean_d 0.5 (x - target)^2 (or the
    pseudo-Huber sqrt(delta^2 + c^2) - c with `huber_c`) over max(mean_d |sg(x) - r|, 1e-6), r the
    `normaliser_reference` [B, ...]. Its gradient in x moves x along `correction`."""
    x = clean.float()
    target = (x.detach() + correction.detach().float()).detach()
    delta = x - target
    residual = 0.5 * delta.pow(2) if huber_c is None else torch.sqrt(delta.pow(2) + huber_c ** 2) - huber_c
    scale = _rows((x.detach() - normaliser_reference.detach().float()).abs()).clamp_min(_EPS)
    return _rows(residual) / scale


def guidance_direction(guided_clean: Tensor, conditional_clean: Tensor, guidance_scale: float,
                       reward_scale: float) -> Tensor | None:
    """The teacher's guidance as a reward direction [B, ...] (fp32, detached): reward_scale / (s - 1)
    (x0_guided - x0_cond), s the guidance scale; None without guidance (s <= 1 or reward_scale 0)."""
    if guidance_scale <= 1.0 or reward_scale == 0.0:
        return None
    return (reward_scale / (guidance_scale - 1.0) * (guided_clean.float() - conditional_clean.float())).detach()


def student_reward_loss(clean: Tensor, surrogate_clean: Tensor, reference_clean: Tensor,
                        guidance: Tensor | None, tdm_weight: float, huber_c: float | None = None) -> Tensor:
    """The student's two reward terms at one boundary, per row [B] (fp32), beside its distribution-matching
    term: tdm_weight revised(x, guidance, x0_ref) + (1 - tdm_weight) revised(x, x0_sur - x0_ref, x0_sur)
    (module docstring, part 2); `guidance` None drops the first."""
    surrogate = revised_target_loss(clean, surrogate_clean.float() - reference_clean.float(), surrogate_clean,
                                    huber_c)
    if guidance is None:
        return (1.0 - tdm_weight) * surrogate
    return tdm_weight * revised_target_loss(clean, guidance, reference_clean, huber_c) + (1.0 - tdm_weight) * surrogate
