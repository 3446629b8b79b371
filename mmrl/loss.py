"""The group-relative clipped surrogate, the same for every family (docs/methods.md, 'Objectives').

Per unit u of row i, with l = log pi_theta - log pi_old grouped by the ratio level:
    rho = exp(l)                       unit (GRPO, DanceGRPO)
    rho = exp(mean_{u in chunk} l)     chunk (Chunk-GRPO)
    rho = exp(mean_{u in row} l)       sequence (GSPO)
    pg  = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))      (DAPO clip-higher)
    pg  = min(pg, -c A) where A < 0                                  (dual clip, c > 1)
    loss_u = pg + beta * KL_u - entropy_coef * H_u + llds_coef * LLDS_u   (REGULARISERS)
and the batch loss is sum_{i,u} w_{iu} loss_{iu}, the weights w coming from the aggregation
over the WHOLE batch, so that micro-batch losses sum to the one-batch loss.

`algorithm.objective` picks the surrogate from OBJECTIVES: ``clip`` (the above) or ``wd1``
(ratio-free weighted likelihood, `weighted_likelihood_loss`). The regularisers are registered
`Regulariser`s that declare what they need from the engine (every row, whole rows, a reference
pass, entropies) and the metrics they report, so the trainer names none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from .config import AlgorithmConfig
from .registry import Registry

KL_ESTIMATORS: Registry[Callable[[Tensor, Tensor], Tensor]] = Registry("KL estimator")
AGGREGATIONS: Registry[Callable[..., Tensor]] = Registry("loss aggregation")
RATIO_LEVELS = ("unit", "chunk", "sequence")
CLOSED_FORM_KL = "closed_form"  # kl_estimator: the policy computes the KL itself (Policy.logprobs_and_kl)


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = -x with x = log pi_ref - log pi_theta (Schulman, 'Approximating KL divergence')."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = x^2 / 2."""
    return 0.5 * (ref_logp - logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(x) - x - 1 (unbiased, non-negative; DeepSeekMath GRPO)."""
    x = ref_logp - logp
    return torch.exp(x) - x - 1


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
class TermInputs:
    """What a regulariser sees for a micro-batch: fp32 [B, u] tensors (`advantages` [B, 1] or
    [B, u]); `ref_logp`, `entropy` and the policy's closed-form `kl` are None when not computed."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    cfg: AlgorithmConfig
    ref_logp: Tensor | None = None
    entropy: Tensor | None = None
    kl: Tensor | None = None


@dataclass(frozen=True)
class Regulariser:
    """A term added to every unit's loss before aggregation, registered in REGULARISERS.

    `weight(cfg)` is its coefficient (0: off). `term(inputs, weight)` returns the per-unit addition
    [B, u] (None: nothing to add) and its metric sums over the micro-batch's units. `metrics`
    maps each sum it reports to (logged name, divided by the units?); missing sums count as 0.
    What it needs from the engine when on: `all_rows` (rows with zero advantage still carry its
    gradient), `whole_rows` (all of a row's units in one slice), `reference` (reference
    log-probs), `entropy` (the units' entropies), `old_policy` (a comparison with the old policy:
    ratio-free objectives skip it)."""

    weight: Callable[[AlgorithmConfig], float]
    term: Callable[[TermInputs, float], tuple[Optional[Tensor], dict[str, float]]]
    metrics: dict[str, tuple[str, bool]]
    all_rows: bool = False
    whole_rows: bool = False
    reference: bool = False
    entropy: bool = False
    old_policy: bool = False


REGULARISERS: Registry[Regulariser] = Registry("regulariser")


def kl_term(x: TermInputs, beta: float) -> tuple[Optional[Tensor], dict[str, float]]:
    """beta KL_u: the policy's closed-form `kl` when given, else `cfg.kl_estimator` on (logp, ref_logp)."""
    if beta == 0.0:
        return None, {}
    if x.kl is None and x.ref_logp is None:
        raise ValueError("algorithm.beta != 0 needs reference log-probs")
    kl = x.kl.float() if x.kl is not None else KL_ESTIMATORS.get(x.cfg.kl_estimator)(x.logp, x.ref_logp.float())
    return beta * kl, {"kl": float((kl.detach() * x.mask).sum())}


def entropy_term(x: TermInputs, coef: float) -> tuple[Optional[Tensor], dict[str, float]]:
    """-entropy_coef H_u; the entropy is measured for logging whenever it was computed."""
    if x.entropy is None:
        return None, {}
    return (-coef * x.entropy if coef != 0.0 else None), {"entropy": float((x.entropy.detach() * x.mask).sum())}


def llds_term(x: TermInputs, coef: float) -> tuple[Optional[Tensor], dict[str, float]]:
    """LLDS: coef max(0, log pi_old - log pi_theta) on the units of `llds_penalty`'s active rows."""
    if coef == 0.0:
        return None, {}
    penalty, active = llds_penalty(x.logp, x.old_logp, x.advantages, x.mask, x.cfg.llds_rows)
    return coef * penalty, {"llds_active": active}


REGULARISERS.register("kl")(Regulariser(lambda cfg: cfg.beta, kl_term, {"kl": ("kl", True)},
                                        all_rows=True, reference=True))
REGULARISERS.register("entropy")(Regulariser(lambda cfg: cfg.entropy_coef, entropy_term,
                                             {"entropy": ("entropy", True)}, all_rows=True, entropy=True))
REGULARISERS.register("llds")(Regulariser(lambda cfg: cfg.llds_coef, llds_term,
                                          {"llds_active": ("llds_active_rows", False)},
                                          all_rows=True, whole_rows=True, old_policy=True))


def active_regularisers(cfg: AlgorithmConfig) -> list[Regulariser]:
    """The regularisers whose weight is non-zero under `cfg`."""
    return [r for _, r in REGULARISERS.items() if r.weight(cfg) != 0.0]


def regulariser_needs(cfg: AlgorithmConfig, need: str) -> bool:
    """Whether any active regulariser needs `need` (all_rows, whole_rows, reference, entropy)."""
    return any(getattr(r, need) for r in active_regularisers(cfg))


def closed_form_kl(cfg: AlgorithmConfig) -> bool:
    """The reference enters through the policy's closed-form KL (`Policy.logprobs_and_kl`)
    instead of a pass of reference log-probs."""
    return regulariser_needs(cfg, "reference") and cfg.kl_estimator == CLOSED_FORM_KL


def reference_pass(cfg: AlgorithmConfig) -> bool:
    """Whether reference log-probs must be computed before the update."""
    return regulariser_needs(cfg, "reference") and not closed_form_kl(cfg)


def metric_names() -> dict[str, tuple[str, bool]]:
    """Every registered regulariser's metric sums: sum name -> (logged name, divided by units?)."""
    return {k: v for _, r in REGULARISERS.items() for k, v in r.metrics.items()}


def add_regularisers(per_unit: Tensor, x: TermInputs, old_policy: bool = True) -> tuple[Tensor, dict[str, float]]:
    """per_unit plus every registered regulariser's term, in registration order, and their metric
    sums (0 for a sum not measured). `old_policy=False` (a ratio-free objective) skips the terms
    that compare with the old policy."""
    sums = {k: 0.0 for k in metric_names()}
    for _, reg in REGULARISERS.items():
        if reg.old_policy and not old_policy:
            continue
        added, metrics = reg.term(x, reg.weight(x.cfg))
        if added is not None:
            per_unit = per_unit + added
        sums.update(metrics)
    return per_unit, sums


LLDS_ROWS = ("non_negative", "all")


def llds_penalty(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, rows: str) -> tuple[Tensor, float]:
    """LLDS's likelihood-preserving penalty [B, u] (before its coefficient) and the number of rows
    it is active on (Deng et al. 2025, "On GRPO Collapse in Search-R1", response-level gate).

    Preserving set: ``rows="non_negative"`` the units whose advantage is >= 0 (the authors' code
    and model card), ``"all"`` every unit. A row is active when its log-likelihood summed over
    its preserving units fell below the old policy's; on an active row each preserving unit
    whose log-prob fell is penalised by max(0, log pi_old - log pi_theta). `adv` is [B, 1] or
    [B, u]; the gate is not differentiated (only the penalty is)."""
    if rows not in LLDS_ROWS:
        raise ValueError(f"algorithm.llds_rows={rows!r} is not one of {', '.join(LLDS_ROWS)}")
    keep = mask * ((adv >= 0).float() if rows == "non_negative" else torch.ones_like(adv))
    drop = (old_logp - logp).detach()
    fell = (drop * keep).sum(dim=1, keepdim=True) > 0
    penalty = torch.relu(old_logp - logp) * keep * fell
    return penalty, float(fell.float().sum())


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
                kl: Tensor | None = None, is_weight: Tensor | None = None) -> LossTerms:
    """Clipped surrogate for a micro-batch: all tensors [B, u] except `advantages` ([B] or [B, u]).

    `weights` come from an AGGREGATIONS entry applied to the whole batch; `segments` are the
    ratio spans (`ratio_segments`) when `cfg.ratio_level == 'chunk'`. `kl` [B, u], when given,
    is the policy's closed-form KL (`kl_estimator: closed_form`) and replaces the estimator.
    `is_weight` [B, u], when given, multiplies each unit's clipped surrogate before the
    regularisers are added (`algorithm.rollout_correction`, mmrl/rollout_correction.py).
    """
    logp, old_logp, mask = logp.float(), old_logp.float(), mask.float()
    adv = advantages.float()
    if adv.dim() == 1:
        adv = adv[:, None]
    log_ratio = grouped_log_ratio(logp - old_logp, mask, cfg.ratio_level, segments)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    per_unit = torch.maximum(unclipped, clipped)
    if cfg.dual_clip is not None:
        if cfg.dual_clip <= 1.0:
            raise ValueError(f"algorithm.dual_clip={cfg.dual_clip} must be > 1")
        per_unit = torch.where(adv < 0, torch.minimum(per_unit, -cfg.dual_clip * adv), per_unit)
    if is_weight is not None:
        per_unit = per_unit * is_weight
    per_unit, sums = add_regularisers(per_unit, TermInputs(logp, old_logp, adv, mask, cfg, ref_logp, entropy, kl))
    loss = (per_unit * weights * mask).sum()
    units = float(mask.sum())
    is_clipped = ((clipped > unclipped) & (mask > 0)).float().sum()
    dev = ((ratio - 1).abs() * mask).max() if units > 0 else torch.zeros(())
    return LossTerms(loss=loss, units=units, clipped=float(is_clipped), ratio_max_dev=float(dev.detach()),
                     metrics=sums)


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


@dataclass(frozen=True)
class Objective:
    """A surrogate: its micro-batch `loss` (policy_loss's signature), whether it takes the
    importance ratio (then old log-probs are kept for mu > 1), and an optional map of the WHOLE
    batch's advantages [N] to per-row coefficients, (advantages, group_id, row_mask) -> [N]."""

    loss: Callable[..., LossTerms]
    uses_ratio: bool
    row_coefficients: Optional[Callable[[Tensor, Tensor, Tensor], Tensor]] = None


OBJECTIVES: Registry[Objective] = Registry("objective")
OBJECTIVES.register("clip")(Objective(policy_loss, uses_ratio=True))
OBJECTIVES.register("wd1")(Objective(weighted_likelihood_loss, uses_ratio=False, row_coefficients=wd1_coefficients))
