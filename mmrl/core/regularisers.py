"""Per-unit regularisers of the surrogate (KL to the reference, entropy bonus, LLDS) and the KL
estimators. Each `Regulariser` declares what it needs from the engine (every row, whole rows, a
reference pass, entropies) and the metrics it reports, so the trainer names none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.registry import Registry

KL_ESTIMATORS: Registry[Callable[[Tensor, Tensor], Tensor]] = Registry("KL estimator")


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
    distill: Tensor | None = None  # each unit's divergence from the distillation teacher, under grad
    dmd: Tensor | None = None  # each unit's DMD loss (distribution matching), under grad


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


def sequence_kl_term(x: TermInputs, beta: float) -> tuple[Optional[Tensor], dict[str, float]]:
    """beta k(sum_u logp, sum_u ref) / |units| on each of a row's units (`kl_level: sequence`;
    ESPO's k2 on the sequence ELBO, which its loss divides by the completion length): summed with
    the seq_mean_token_mean weights, beta times the mean over rows of k / |units|."""
    if beta == 0.0:
        return None, {}
    if x.ref_logp is None:
        raise ValueError("algorithm.beta != 0 needs reference log-probs")
    mask = x.mask.float()
    units = mask.sum(1, keepdim=True).clamp(min=1)
    seq = KL_ESTIMATORS.get(x.cfg.kl_estimator)((x.logp * mask).sum(1, keepdim=True),
                                                (x.ref_logp.float() * mask).sum(1, keepdim=True))
    kl = (seq / units).expand_as(mask)
    return beta * kl, {"kl": float((kl.detach() * mask).sum())}


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


REGULARISERS.register("kl")(Regulariser(lambda cfg: cfg.beta if cfg.kl_level == "unit" else 0.0, kl_term,
                                        {"kl": ("kl", True)}, all_rows=True, reference=True))


REGULARISERS.register("sequence_kl")(Regulariser(lambda cfg: cfg.beta if cfg.kl_level == "sequence" else 0.0,
                                                 sequence_kl_term, {"kl": ("kl", True)}, all_rows=True,
                                                 whole_rows=True, reference=True))


REGULARISERS.register("entropy")(Regulariser(lambda cfg: cfg.entropy_coef, entropy_term,
                                             {"entropy": ("entropy", True)}, all_rows=True, entropy=True))


REGULARISERS.register("llds")(Regulariser(lambda cfg: cfg.llds_coef, llds_term,
                                          {"llds_active": ("llds_active_rows", False)},
                                          all_rows=True, whole_rows=True, old_policy=True))


def distill_term(x: TermInputs, weight: float) -> tuple[Optional[Tensor], dict[str, float]]:
    """weight d_u, the unit's divergence from the distillation teacher (`algorithm.distill.form: loss`)."""
    if weight == 0.0:
        return None, {}
    if x.distill is None:
        raise ValueError("algorithm.distill.form='loss' needs the units' divergence from the teacher")
    return weight * x.distill.float(), {"distill": float((x.distill.detach() * x.mask).sum())}


REGULARISERS.register("distill")(Regulariser(
    lambda cfg: cfg.distill.weight if cfg.distill.active and cfg.distill.form == "loss" else 0.0, distill_term,
    {"distill": ("distill_loss_divergence", True)}, all_rows=True))


def dmd_term(x: TermInputs, weight: float) -> tuple[Optional[Tensor], dict[str, float]]:
    """weight l_u, the unit's DMD loss (`algorithm.distribution_matching`; its gradient is DMD2's)."""
    if weight == 0.0:
        return None, {}
    if x.dmd is None:
        raise ValueError("algorithm.distribution_matching.enabled=true needs the units' DMD losses")
    return weight * x.dmd.float(), {"dmd": float((x.dmd.detach() * x.mask).sum())}


REGULARISERS.register("distribution_matching")(Regulariser(
    lambda cfg: cfg.distribution_matching.weight if cfg.distribution_matching.enabled else 0.0, dmd_term,
    {"dmd": ("dmd_loss", True)}, all_rows=True))


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
