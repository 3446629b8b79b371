"""Advantages of a step from its named rewards: the rewards combined (weighted sum, gate, product,
or each estimated then summed), an estimator of mmrl/core/estimators.py, DAPO's zero-variance
filter and Flow-GRPO's clip, with the statistics the trainer logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmrl.core.estimators import ADVANTAGE_ESTIMATORS, AdvantageOptions, group_index
from mmrl.core.objectives import OBJECTIVES


@dataclass
class AdvantageResult:
    """advantages [N] or [N, U] (0 on rows outside row_mask); row_mask bool [N]; total_reward the
    weighted reward sum ([N] or [N, U], NaN where no reward applied); stats (floats) for logging."""

    advantages: Tensor
    row_mask: Tensor
    total_reward: Tensor
    stats: dict[str, float] = field(default_factory=dict)


def row_magnitude(advantages: Tensor) -> Tensor:
    """max_u |A_iu| per row ([N]); zero means the row carries no policy gradient."""
    return advantages.abs() if advantages.dim() == 1 else advantages.abs().amax(dim=1)


def group_variance_mask(total: Tensor, group_id: Tensor) -> Tensor:
    """Which groups have non-zero reward variance (DAPO dynamic sampling keeps only these).

    total: rewards [N] or [N, U]; group_id: [N] (any ids). Returns bool [num_groups], entry k for
    the k-th smallest id (so entry k is group k when the ids are 0..G-1): True when, for at least
    one unit, the group's non-NaN values are not all equal. A group with fewer than two valid
    values per unit counts as zero-variance (it gives GRPO no gradient).
    """
    inv, n = group_index(group_id)
    flat = (total if total.dim() == 2 else total[:, None]).double()
    valid = ~flat.isnan()
    index = inv[:, None].expand_as(flat)
    shape = (n, flat.shape[1])
    lo = torch.full(shape, float("inf"), dtype=torch.float64, device=flat.device)
    hi = torch.full(shape, float("-inf"), dtype=torch.float64, device=flat.device)
    lo = lo.scatter_reduce(0, index, torch.where(valid, flat, float("inf")), "amin")
    hi = hi.scatter_reduce(0, index, torch.where(valid, flat, float("-inf")), "amax")
    cnt = torch.zeros(shape, device=flat.device).index_add_(0, inv, valid.float())
    return ((hi > lo) & (cnt >= 2)).any(dim=1)


def _broadcast(rewards: dict[str, Tensor]) -> dict[str, Tensor]:
    """Every reward as float, an [N] one broadcast to [N, U] when another reward is [N, U]."""
    if not rewards:
        raise ValueError("compute_advantages needs at least one reward")
    n = {v.shape[0] for v in rewards.values()}
    widths = {v.shape[1] for v in rewards.values() if v.dim() == 2}
    if len(n) > 1 or len(widths) > 1 or any(v.dim() not in (1, 2) for v in rewards.values()):
        shapes = {k: tuple(v.shape) for k, v in rewards.items()}
        raise ValueError(f"rewards must all be [N] or [N, U] with the same N and U; got {shapes}")
    shape = (n.pop(), widths.pop()) if widths else (n.pop(),)
    return {k: (v if v.dim() == len(shape) else v[:, None]).expand(shape).float()
            for k, v in rewards.items()}


def weighted_total(rewards: dict[str, Tensor], weights: dict[str, float]) -> Tensor:
    """sum_k w_k r_k over the rewards that apply (non-NaN) to each entry; NaN where none applies.
    An [N] reward beside an [N, U] one is broadcast over units."""
    rs = _broadcast(rewards)
    stacked = torch.stack([float(weights[k]) * v for k, v in rs.items()])
    return torch.where(stacked.isnan().all(0), float("nan"), stacked.nansum(0))


COMBINES = ("sum", "advantage", "gate", "product")


def check_reward_combine(combine: str, gates: dict[str, float], weights: dict[str, float]) -> None:
    """Raise ValueError, naming the field, when `algorithm.reward_combine` and `algorithm.gates`
    do not fit the recipe's rewards (`weights`: name -> weight)."""
    if combine not in COMBINES:
        raise ValueError(f"algorithm.reward_combine={combine!r} is not one of {', '.join(COMBINES)}")
    if combine != "gate":
        if gates:
            raise ValueError(f"algorithm.gates={gates} is only used with algorithm.reward_combine: gate "
                             f"(got {combine!r})")
        return
    if not gates:
        raise ValueError("algorithm.reward_combine: gate needs algorithm.gates (reward name -> threshold), "
                         "e.g. {format: 1.0}")
    unknown = sorted(set(gates) - set(weights))
    if unknown:
        raise ValueError(f"algorithm.gates: {unknown} not among the recipe's rewards {sorted(weights)}")
    if not set(weights) - set(gates):
        raise ValueError(f"algorithm.gates: every reward ({sorted(weights)}) is a gate; "
                         "at least one reward must be gated")


def gated_total(rewards: dict[str, Tensor], weights: dict[str, float], gates: dict[str, float]) -> Tensor:
    """``reward_combine: gate`` (Vision-R1's hard formatting result reward). With G the gate
    rewards (``algorithm.gates``: name -> threshold t_g) and R the others, per entry:

        open   = AND over the gates g that apply (non-NaN) of [r_g >= t_g]  (True if none applies)
        result = sum_{k in R that apply} w_k r_k                              (NaN if none applies)
        total  = (result if open else 0) + sum_{g in G that apply} w_g r_g

    NaN where no term applies. A gate that is None (NaN) for a row neither closes the gate nor
    pays; with gate weights 0 and a 0/1 format gate at threshold 1 the total is Vision-R1's
    "result reward only when the format is right"."""
    rs = _broadcast(rewards)
    results = {k: v for k, v in rs.items() if k not in gates}
    gate_terms = {k: v for k, v in rs.items() if k in gates}
    result = weighted_total(results, weights)
    shut = torch.zeros_like(result, dtype=torch.bool)
    for name, value in gate_terms.items():
        shut |= ~value.isnan() & (value < float(gates[name]))
    result = torch.where(shut & ~result.isnan(), 0.0, result)
    parts = torch.stack([result, *(float(weights[k]) * v for k, v in gate_terms.items())])
    return torch.where(parts.isnan().all(0), float("nan"), parts.nansum(0))


def product_total(rewards: dict[str, Tensor], weights: dict[str, float]) -> Tensor:
    """``reward_combine: product``: prod_k w_k r_k over the rewards that apply (non-NaN) to each
    entry; NaN where none applies (so a weight only scales the total)."""
    rs = _broadcast(rewards)
    stacked = torch.stack([float(weights[k]) * v for k, v in rs.items()])
    return torch.where(stacked.isnan().all(0), float("nan"), torch.nan_to_num(stacked, nan=1.0).prod(0))


def combined_total(rewards: dict[str, Tensor], weights: dict[str, float], combine: str = "sum",
                   gates: dict[str, float] | None = None) -> Tensor:
    """The scalar reward of each entry under `combine`: the weighted sum (`sum`, and `advantage`,
    whose logged total is the weighted sum), `gated_total` or `product_total`."""
    if combine == "gate":
        return gated_total(rewards, weights, gates or {})
    if combine == "product":
        return product_total(rewards, weights)
    return weighted_total(rewards, weights)


def row_scores(values: Tensor) -> Tensor:
    """One score per row ([N]): the value itself for [N], the mean over units (NaN left out) for
    [N, U]."""
    return values if values.dim() == 1 else values.nanmean(dim=1)


def extreme_rows(scores: Tensor, group_id: Tensor, row_mask: Tensor, k: int) -> Tensor:
    """DanceGRPO's best-of-N: bool [N], True on the k lowest- and the k highest-scoring rows of each
    group among the rows of `row_mask` (scores [N], NaN never chosen). A group is sorted ascending
    by a stable sort, the first k and the last k rows train: at a tie the earlier row counts as
    the lower. A group with 2k candidates or fewer keeps them all."""
    keep = torch.zeros_like(row_mask)
    candidates = row_mask & ~scores.isnan()
    for g in torch.unique(group_id):
        rows = ((group_id == g) & candidates).nonzero().flatten()
        if len(rows) <= 2 * k:
            keep[rows] = True
            continue
        order = rows[torch.sort(scores[rows], stable=True).indices]
        keep[order[:k]] = True
        keep[order[-k:]] = True
    return keep


def batch_standardised(adv: Tensor, row_mask: Tensor, eps: float) -> Tensor:
    """GDPO's second normalisation (Pref-GRPO's ``--apply_gdpo``): the combined advantages
    standardised over the whole batch, (A - mean A) / (std A + eps), the mean and the unbiased std
    taken over the rows in `row_mask` (every unit of an [N, U] advantage)."""
    kept = adv[row_mask]
    if kept.numel() < 2:
        return adv
    return (adv - kept.mean()) / (kept.std() + eps)


def std_ddof(cfg) -> int:
    """The stds' delta degrees of freedom: `algorithm.std_ddof`, or where it is null the objective's
    authors' (`Objective.std_ddof`: 0 for DiffusionNFT's nft, 1 otherwise)."""
    return cfg.std_ddof if cfg.std_ddof is not None else OBJECTIVES.get(cfg.objective).std_ddof


def compute_advantages(rewards: dict[str, Tensor], weights: dict[str, float], group_id: Tensor,
                       cfg) -> AdvantageResult:
    """Advantages for a batch of named rewards ([N] or [N, U] each; NaN = not applicable).

    cfg (an `AlgorithmConfig`): ``estimator`` (a name in ADVANTAGE_ESTIMATORS), ``std``, ``eps``,
    ``std_ddof`` (`std_ddof`), ``max_reward``; ``reward_combine`` "sum" (estimate on the weighted sum), "advantage"
    (estimate each reward, then the weighted sum of advantages: DanceGRPO video, MixGRPO; row_mask
    is the AND), "gate" (estimate on `gated_total` with ``gates``: Vision-R1) or "product"
    (estimate on `product_total`); ``drop_zero_variance`` (DAPO: groups whose totals are all equal get advantage 0
    and row_mask False); ``batch_renorm`` (GDPO: the combined advantages standardised over the
    batch, `batch_standardised`, before the clip); ``clip_advantage`` c (clamp to [-c, c]; Flow-GRPO uses 5). Rows whose
    total is NaN (for [N, U]: in every unit) get row_mask False. Advantages are 0 outside
    row_mask. ``train_extremes`` k > 0 (DanceGRPO's best-of-N): of each group only the k rows with
    the lowest and the k with the highest advantage (``train_extremes_by: reward``: total reward)
    keep row_mask (`extreme_rows`), the advantages still those of the whole group. Stats:
    advantage_mean / _std / _abs_mean over the rows in row_mask, zero_variance_frac (groups whose
    totals are all equal), num_groups.
    """
    # Built-ins are found without importing the plugins (a plugin cannot replace a built-in).
    estimator = ADVANTAGE_ESTIMATORS.get(cfg.estimator)
    opts = AdvantageOptions(std=cfg.std, eps=cfg.eps, ddof=std_ddof(cfg), max_reward=cfg.max_reward,
                            median_scale=cfg.median_scale, median_rescale=cfg.median_rescale)
    rs = _broadcast(rewards)  # the combination's settings are checked with the recipe (`check_reward_combine`)
    total = combined_total(rewards, weights, cfg.reward_combine, cfg.gates)
    n = total.shape[0]
    if group_id.shape != (n,):
        raise ValueError(f"group_id must be [N] = [{n}]; got shape {tuple(group_id.shape)}")
    if cfg.reward_combine in ("sum", "gate", "product"):
        adv, row_mask = estimator(total, group_id, opts)
    elif cfg.reward_combine == "advantage":
        adv = torch.zeros_like(total)
        row_mask = torch.ones(n, dtype=torch.bool, device=total.device)
        for k, v in rs.items():
            a, m = estimator(v, group_id, opts)
            adv = adv + float(weights[k]) * a
            row_mask = row_mask & m
    informative = group_variance_mask(total, group_id)
    if cfg.drop_zero_variance:
        row_mask = row_mask & informative[group_index(group_id)[0]]
    row_mask = row_mask & ~(total.isnan() if total.dim() == 1 else total.isnan().all(1))
    if cfg.train_extremes:
        ranked = row_scores(adv if cfg.train_extremes_by == "advantage" else total)
        row_mask = row_mask & extreme_rows(ranked, group_id, row_mask, cfg.train_extremes)
    if cfg.batch_renorm:
        adv = batch_standardised(adv, row_mask, cfg.eps)
    if cfg.clip_advantage is not None:
        adv = adv.clamp(-cfg.clip_advantage, cfg.clip_advantage)
    adv = torch.where(row_mask.view((n,) + (1,) * (adv.dim() - 1)), adv, 0.0)
    kept = adv[row_mask]
    stats = {
        "advantage_mean": float(kept.mean()) if kept.numel() else 0.0,
        "advantage_std": float(kept.std()) if kept.numel() > 1 else 0.0,
        "advantage_abs_mean": float(kept.abs().mean()) if kept.numel() else 0.0,
        "zero_variance_frac": float(1 - informative.float().mean()) if len(informative) else 0.0,
        "num_groups": float(len(informative)),
    }
    return AdvantageResult(adv, row_mask, total, stats)
