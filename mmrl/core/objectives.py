"""The group-relative clipped surrogate, the same for every family (docs/methods.md, 'Objectives').

Per unit u of row i, with l = log pi_theta - log pi_old grouped by the ratio level:
    rho = exp(l)                       unit (GRPO, DanceGRPO)
    rho = exp(mean_{u in chunk} l)     chunk (Chunk-GRPO)
    rho = exp(mean_{u in row} l)       sequence (GSPO)
    pg  = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))      (DAPO clip-higher)
    pg  = min(pg, -c A) where A < 0                                  (dual clip, c > 1)
    pg  = 0 if KL_old,u >= tau and rho moves with A, else -A rho     (trust_region dppo: FlowDPPO)
    loss_u = pg + beta * KL_u - entropy_coef * H_u + llds_coef * LLDS_u   (REGULARISERS)
and the batch loss is sum_{i,u} w_{iu} loss_{iu}, the weights w coming from the aggregation
over the WHOLE batch, so that micro-batch losses sum to the one-batch loss.

`algorithm.objective` picks the surrogate from OBJECTIVES: ``clip`` (the above), ``wd1``
(ratio-free weighted likelihood, `weighted_likelihood_loss`), ``nft`` (DiffusionNFT's
reward-weighted positive / negative denoising losses on the forward process, `nft_loss`) or ``spg``
(SPG's sandwiched policy gradient on a lower and an upper bound, `sandwiched_loss`). The regularisers are registered
`Regulariser`s that declare what they need from the engine (every row, whole rows, a reference
pass, entropies) and the metrics they report, so the trainer names none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.core.regularisers import TermInputs, add_regularisers
from mmrl.registry import Registry

AGGREGATIONS: Registry[Callable[..., Tensor]] = Registry("loss aggregation")


RATIO_LEVELS = ("unit", "chunk", "sequence")


@AGGREGATIONS.register("token_mean")
def token_mean(mask: Tensor, total_units: float, total_rows: float, max_units: int) -> Tensor:
    """w = 1 / (units in the batch)  (DAPO)."""
    return mask / total_units


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(mask: Tensor, total_units: float, total_rows: float, max_units: int) -> Tensor:
    """w_i = 1 / (rows x |o_i|)  (original GRPO: mean over tokens, then over sequences)."""
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1)
    return mask / (lengths * total_rows)


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(mask: Tensor, total_units: float, total_rows: float, max_units: int) -> Tensor:
    """w = 1 / (rows x max units)  (Dr. GRPO constant normaliser)."""
    return mask / (total_rows * max_units)


def ratio_segments(level: str, num_units: int, chunks: list[int] | None) -> list[slice]:
    """The spans of units that share one importance ratio."""
    if level == "unit":
        return [slice(u, u + 1) for u in range(num_units)]
    if level == "sequence":
        return [slice(0, num_units)]
    if level == "chunk":
        if not chunks:
            raise ValueError("algorithm.ratio_level='chunk' needs algorithm.chunks (sizes of consecutive unit spans)")
        if sum(chunks) != num_units or min(chunks) < 1:
            raise ValueError(f"algorithm.chunks={chunks} must be positive sizes summing to the {num_units} units")
        out, start = [], 0
        for size in chunks:
            out.append(slice(start, start + size))
            start += size
        return out
    raise ValueError(f"algorithm.ratio_level={level!r} is not one of {RATIO_LEVELS}")


def grouped_log_ratio(log_ratio: Tensor, mask: Tensor, level: str, segments: list[slice] | None) -> Tensor:
    """Replace each unit's log-ratio by the masked mean over its ratio segment."""
    if level == "unit":
        return log_ratio
    if level == "sequence":
        segments = [slice(0, log_ratio.shape[1])]
    parts = []
    for seg in segments:
        lr, m = log_ratio[:, seg], mask[:, seg]
        mean = (lr * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(min=1)
        parts.append(mean.expand_as(lr))
    return torch.cat(parts, dim=1)


@dataclass
class LossTerms:
    """The micro-batch loss and unit-weighted sums for logging (divide by `units`); `metrics` holds
    the regularisers' sums (`metric_names`)."""

    loss: Tensor
    units: float
    clipped: float
    ratio_max_dev: float
    metrics: dict[str, float] = field(default_factory=dict)


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, weights: Tensor,
                cfg: AlgorithmConfig, *, segments: list[slice] | None = None,
                ref_logp: Tensor | None = None, entropy: Tensor | None = None,
                kl: Tensor | None = None, is_weight: Tensor | None = None,
                step_scales: tuple[Tensor, Tensor] | None = None, divergence: Tensor | None = None,
                distill: Tensor | None = None, dmd: Tensor | None = None,
                clip_range: tuple[Tensor, Tensor] | None = None) -> LossTerms:
    """Clipped surrogate for a micro-batch: all tensors [B, u] except `advantages` ([B] or [B, u]).

    `weights` come from an AGGREGATIONS entry applied to the whole batch; `segments` are the
    ratio spans (`ratio_segments`) when `cfg.ratio_level == 'chunk'`. `kl` [B, u], when given,
    is the policy's closed-form KL (`kl_estimator: closed_form`) and replaces the estimator.
    `is_weight` [B, u], when given, multiplies each unit's clipped surrogate before the
    regularisers are added (`algorithm.rollout_correction`, mmrl/core/rollout_correction.py).
    `step_scales` (ratio scale, loss scale) [B, u], under `algorithm.ratio_norm: grpo_guard`, multiply
    each unit's log-ratio and its clipped surrogate (GRPO-Guard: the step's std and 1 / |dt|).
    `divergence` [B, u], under `algorithm.trust_region: dppo`, is each unit's KL between the old and
    the current policy (`dppo_held`; None: the policy is the old one, divergence 0). `distill` [B, u],
    under `algorithm.distill.form: loss`, is each unit's divergence from the teacher, under grad; `dmd`
    [B, u], under `algorithm.distribution_matching`, each unit's DMD loss, under grad.
    `clip_range` (eps_low, eps_high) [B, u], when given, is each unit's own clip range
    (`Policy.unit_clip`), in place of `cfg.eps_low` / `cfg.eps_high`.
    """
    logp, old_logp, mask = logp.float(), old_logp.float(), mask.float()
    adv = advantages.float()
    if adv.dim() == 1:
        adv = adv[:, None]
    log_ratio = grouped_log_ratio(logp - old_logp, mask, cfg.ratio_level, segments)
    if step_scales is not None:
        log_ratio = log_ratio * step_scales[0]
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    if cfg.trust_region == "dppo":
        held = dppo_held(ratio, adv, divergence if divergence is not None else torch.zeros_like(ratio),
                         cfg.dppo_threshold)
        per_unit = torch.where(held, torch.zeros_like(unclipped), unclipped)
        limited = held  # logged as clip_frac
    else:
        low, high = clip_range if clip_range is not None else (cfg.eps_low, cfg.eps_high)
        clipped = -adv * torch.clamp(ratio, 1.0 - low, 1.0 + high)  # bounds: numbers, or [B, u] per unit
        per_unit = torch.maximum(unclipped, clipped)
        limited = clipped > unclipped
    if cfg.dual_clip is not None:  # c > 1, checked with the recipe (mmrl/train/plan/validate.py)
        per_unit = torch.where(adv < 0, torch.minimum(per_unit, -cfg.dual_clip * adv), per_unit)
    if step_scales is not None:
        per_unit = per_unit * step_scales[1]
    if is_weight is not None:
        per_unit = per_unit * is_weight
    per_unit, sums = add_regularisers(per_unit, TermInputs(logp, old_logp, adv, mask, cfg, ref_logp, entropy, kl,
                                                           distill, dmd))
    loss = (per_unit * weights * mask).sum()
    units = float(mask.sum())
    is_clipped = (limited & (mask > 0)).float().sum()
    dev = ((ratio - 1).abs() * mask).max() if units > 0 else torch.zeros(())
    return LossTerms(loss=loss, units=units, clipped=float(is_clipped), ratio_max_dev=float(dev.detach()),
                     metrics=sums)


def dppo_held(ratio: Tensor, adv: Tensor, divergence: Tensor, threshold: float) -> Tensor:
    """FlowDPPO's KL-ADV mask (UniRL's `_flowdppo_kl_adv_loss`), bool [B, u]: the units whose loss
    -A rho is dropped, those whose divergence from the old policy is >= `threshold` and whose ratio
    moves the way the advantage pushes it (rho > 1 with A > 0, or rho < 1 with A < 0). A unit far
    from the old policy but moving back towards it keeps its gradient."""
    pushed = ((ratio > 1) & (adv > 0)) | ((ratio < 1) & (adv < 0))
    return ((divergence >= threshold) & pushed).detach()


def wd1_coefficients(advantages: Tensor, group_id: Tensor, row_mask: Tensor) -> Tensor:
    """c_i = softmax_g(-A)_i - softmax_g(A)_i over the rows of i's group g that take part
    (`row_mask`), 0 elsewhere (wd1, Tang et al. 2025; softmax per group, not per local batch)."""
    out = torch.zeros_like(advantages, dtype=torch.float32)
    for g in torch.unique(group_id):
        rows = ((group_id == g) & row_mask).nonzero().flatten()
        if len(rows):
            a = advantages[rows].float()
            out[rows] = torch.softmax(-a, dim=0) - torch.softmax(a, dim=0)
    return out


def weighted_likelihood_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, weights: Tensor,
                             cfg: AlgorithmConfig, *, segments: list[slice] | None = None,
                             ref_logp: Tensor | None = None, entropy: Tensor | None = None,
                             kl: Tensor | None = None, is_weight: Tensor | None = None) -> LossTerms:
    """wd1's ratio-free objective: loss_u = c_i log pi_theta(u) (+ beta KL_u - entropy_coef H_u),
    with c_i = `advantages` from `wd1_coefficients`. Summed with unit weights (log L_i = sum of
    its units) it is wd1's -sum_i softmax(A)_i log L_i + sum_i softmax(-A)_i log L_i; the
    aggregations `token_mean` and `seq_mean_token_sum_norm` scale that by a positive constant per
    batch, `seq_mean_token_mean` uses length-normalised log L_i. No ratio, no old log-probs."""
    logp, mask = logp.float(), mask.float()
    coef = advantages.float()
    if coef.dim() != 1:
        raise ValueError("algorithm.objective='wd1' needs one advantage per row, not step-level rewards")
    per_unit = coef[:, None] * logp
    if is_weight is not None:  # the rollout correction (policy_loss)
        per_unit = per_unit * is_weight
    inputs = TermInputs(logp, old_logp.float(), coef[:, None], mask, cfg, ref_logp, entropy, kl)
    per_unit, sums = add_regularisers(per_unit, inputs, old_policy=False)
    loss = (per_unit * weights * mask).sum()
    dev = (((logp - old_logp.float()).detach().exp() - 1).abs() * mask).max() if mask.sum() > 0 else torch.zeros(())
    return LossTerms(loss=loss, units=float(mask.sum()), clipped=0.0, ratio_max_dev=float(dev), metrics=sums)


def nft_reward_weight(advantages: Tensor, clip: float) -> Tensor:
    """DiffusionNFT's optimality probability r = clip(A, -c, c) / (2 c) + 1/2, in [0, 1]."""
    return (advantages.float().clamp(-clip, clip) / clip / 2 + 0.5).clamp(0.0, 1.0)


def nft_loss(positive: Tensor, negative: Tensor, advantages: Tensor, mask: Tensor, weights: Tensor,
             cfg: AlgorithmConfig, *, kl: Tensor | None = None) -> LossTerms:
    """DiffusionNFT: loss_u = c (r L+_u + (1 - r) L-_u) / nft_beta (+ beta KL_u), with L+ / L- the
    unit's positive / negative implicit-velocity losses [B, u] (`Policy.implicit_velocity_losses`),
    r = `nft_reward_weight` of the row's advantage and c = nft_adv_clip (the authors' scale).
    Aggregated with unit weights as the other objectives (token_mean: the authors' mean over
    samples and noise levels). No ratio: the old policy enters through L+ and L-."""
    mask = mask.float()
    adv = advantages.float()
    if adv.dim() != 1:
        raise ValueError("algorithm.objective='nft' needs one advantage per row, not step-level rewards")
    r = nft_reward_weight(adv, cfg.nft_adv_clip)[:, None]
    per_unit = (r * positive + (1 - r) * negative) / cfg.nft_beta * cfg.nft_adv_clip
    inputs = TermInputs(positive, positive.detach(), adv[:, None], mask, cfg, kl=kl)
    per_unit, sums = add_regularisers(per_unit, inputs, old_policy=False)
    loss = (per_unit * weights * mask).sum()
    return LossTerms(loss=loss, units=float(mask.sum()), clipped=0.0, ratio_max_dev=0.0, metrics=sums)


def sandwiched_loss(lower: Tensor, upper: Tensor, advantages: Tensor, mask: Tensor, weights: Tensor,
                    cfg: AlgorithmConfig) -> LossTerms:
    """SPG (Wang et al. 2025): loss_u = -A lower_u on the rows with A > 0, -A upper_u on the others,
    lower / upper the policy's per-unit bound terms [B, u] (`Policy.logprob_bounds`): raising a
    lower bound of the likelihood of what was rewarded and lowering an upper bound of the rest. No
    ratio, no old policy (SPG's `compute_loss`); aggregated with unit weights (token_mean: SPG's
    sum_i A_i L_i |o_i| / sum_i |o_i|, with per-unit terms that sum to |o_i| L_i)."""
    mask = mask.float()
    adv = advantages.float()
    if adv.dim() != 1:
        raise ValueError("algorithm.objective='spg' needs one advantage per row, not step-level rewards")
    bound = torch.where((adv > 0)[:, None], lower.float(), upper.float())
    loss = (-adv[:, None] * bound * weights * mask).sum()
    return LossTerms(loss=loss, units=float(mask.sum()), clipped=0.0, ratio_max_dev=0.0, metrics={})


UNIT_TERMS = ("logprobs", "implicit_velocity", "logprob_bounds")


@dataclass(frozen=True)
class Objective:
    """A surrogate: its micro-batch `loss`, whether it takes the importance ratio (then old
    log-probs are kept for mu > 1), an optional map of the WHOLE batch's advantages [N] to per-row
    coefficients, (advantages, group_id, row_mask) -> [N], what it takes from the adapter
    (`unit_terms`): ``logprobs`` (policy_loss's signature), ``implicit_velocity`` (the positive
    and negative losses of `Policy.implicit_velocity_losses`, nft_loss's signature) or
    ``logprob_bounds`` (`Policy.logprob_bounds`, sandwiched_loss's signature), and the std its
    authors normalise rewards by (`std_ddof`: 1 unbiased, 0 population; `algorithm.std_ddof: null`)."""

    loss: Callable[..., LossTerms]
    uses_ratio: bool
    row_coefficients: Optional[Callable[[Tensor, Tensor, Tensor], Tensor]] = None
    unit_terms: str = "logprobs"
    std_ddof: int = 1


OBJECTIVES: Registry[Objective] = Registry("objective")


OBJECTIVES.register("clip")(Objective(policy_loss, uses_ratio=True))


OBJECTIVES.register("wd1")(Objective(weighted_likelihood_loss, uses_ratio=False, row_coefficients=wd1_coefficients))


# DiffusionNFT's PerPromptStatTracker takes numpy's (population) std
OBJECTIVES.register("nft")(Objective(nft_loss, uses_ratio=False, unit_terms="implicit_velocity", std_ddof=0))


OBJECTIVES.register("spg")(Objective(sandwiched_loss, uses_ratio=False, unit_terms="logprob_bounds"))
