"""Advantage estimators over a reward tensor [N] or [N, U] and `group_id` [N]
(docs/methods.md, 'Advantage estimators').

An estimator is a small pure function ``fn(rewards, group_id, opts) -> (advantages, row_mask)``:
``advantages`` has the shape of ``rewards``; ``row_mask`` (bool [N]) marks the rows that take part
in the loss (False only for MC-GRPO's pivot). NaN rewards mean "not applicable": they are left out
of every statistic (mean, std, median, comparisons) and get advantage 0. Groups are given by
arbitrary ids (not necessarily contiguous, sizes may differ). Statistics are taken within a group
along dim 0, independently for each trailing index, so an estimator run on [N, U] equals the
estimator run on each column ``rewards[:, u]``.

`compute_advantages` combines several named rewards (weighted sum, gate or product then estimate,
or estimate each then weighted sum), applies DAPO's zero-variance filter and Flow-GRPO's clip, and reports stats.
New estimators register with ``@register_estimator("name")`` and are chosen by
``algorithm.estimator``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from .registry import Registry

Estimator = Callable[[Tensor, Tensor, "AdvantageOptions"], "tuple[Tensor, Tensor]"]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")

STD_MODES = ("group", "batch", "none")
MEDIAN_SCALES = ("mad", "std")
MAD_EPS = 1e-3  # MC-GRPO's code: advantages / (median absolute deviation + 1e-3)


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator: register ``fn(rewards, group_id, opts) -> (advantages, row_mask)`` as `name`."""
    return ADVANTAGE_ESTIMATORS.register(name)


@dataclass
class AdvantageOptions:
    """Options shared by the estimators.

    std: "group" divides by the group's std, "batch" by the std of every (non-NaN) reward in the
    batch (Flow-GRPO's global std; per unit index for [N, U]), "none" does not divide. Stds are
    unbiased (correction 1, as TRL); fewer than 2 valid values give std 0.
    eps: added to the std. max_reward: NGRPO's virtual sample.
    median_scale, median_rescale: the MC-GRPO (`median`) estimator's normaliser and rescale.
    """

    std: str = "group"
    eps: float = 1e-4
    max_reward: float = 1.0
    median_scale: str = "mad"
    median_rescale: bool = False

    def __post_init__(self):
        if self.std not in STD_MODES:
            raise ValueError(f"algorithm.std={self.std!r} is not one of {', '.join(STD_MODES)}")
        if self.median_scale not in MEDIAN_SCALES:
            raise ValueError(f"algorithm.median_scale={self.median_scale!r} is not one of {', '.join(MEDIAN_SCALES)}")


@dataclass
class AdvantageResult:
    """advantages [N] or [N, U] (0 on rows outside row_mask); row_mask bool [N]; total_reward the
    weighted reward sum ([N] or [N, U], NaN where no reward applied); stats (floats) for logging."""

    advantages: Tensor
    row_mask: Tensor
    total_reward: Tensor
    stats: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- group helpers


def _dense(group_id: Tensor) -> tuple[Tensor, int]:
    """(index 0..G-1 of each row's group, in sorted order of the ids; number of groups G)."""
    if group_id.dim() != 1:
        raise ValueError(f"group_id must be 1-D [N]; got shape {tuple(group_id.shape)}")
    uniq, inv = torch.unique(group_id, return_inverse=True)
    return inv, len(uniq)


def _check(r: Tensor, group_id: Tensor) -> None:
    if r.dim() not in (1, 2) or r.shape[0] != group_id.shape[0]:
        raise ValueError(f"rewards must be [N] or [N, U] with N = len(group_id) = {len(group_id)}; "
                         f"got shape {tuple(r.shape)}")


def _out_dtype(r: Tensor) -> torch.dtype:
    return r.dtype if r.is_floating_point() else torch.float32


def _seg_sum(x: Tensor, inv: Tensor, n: int) -> Tensor:
    out = torch.zeros((n,) + x.shape[1:], dtype=x.dtype, device=x.device)
    return out.index_add_(0, inv, x)


def _group_moments(r: Tensor, group_id: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per row, in float64: nan-aware group (sum, count, mean, unbiased std; std 0 when count < 2)."""
    inv, n = _dense(group_id)
    valid = ~r.isnan()
    x = torch.where(valid, r.double(), 0.0)
    cnt = _seg_sum(valid.double(), inv, n)
    total = _seg_sum(x, inv, n)
    mean = total / cnt.clamp(min=1)
    dev = torch.where(valid, x - mean[inv], 0.0)
    var = _seg_sum(dev * dev, inv, n) / (cnt - 1).clamp(min=1)
    std = torch.where(cnt >= 2, var.sqrt(), 0.0)
    return total[inv], cnt[inv], mean[inv], std[inv]


def _batch_std(r: Tensor) -> Tensor:
    """Unbiased nan-aware std over dim 0 (a scalar for [N], one per unit for [N, U]), float64."""
    valid = ~r.isnan()
    x = torch.where(valid, r.double(), 0.0)
    cnt = valid.sum(0).double()
    mean = x.sum(0) / cnt.clamp(min=1)
    dev = torch.where(valid, x - mean, 0.0)
    var = (dev * dev).sum(0) / (cnt - 1).clamp(min=1)
    return torch.where(cnt >= 2, var.sqrt(), 0.0)


def _scale(centered: Tensor, r: Tensor, group_std: Tensor, opts: AdvantageOptions) -> Tensor:
    if opts.std == "group":
        return centered / (group_std + opts.eps)
    if opts.std == "batch":
        return centered / (_batch_std(r) + opts.eps)
    if opts.std == "none":
        return centered
    raise ValueError(f"algorithm.std={opts.std!r} is not one of {', '.join(STD_MODES)}")


def _finish(adv: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """Zero the advantage of NaN rewards; every row takes part."""
    adv = torch.where(r.isnan(), 0.0, adv).to(_out_dtype(r))
    return adv, torch.ones(r.shape[0], dtype=torch.bool, device=r.device)


def _padded(r: Tensor, group_id: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Rewards laid out as [G, M, ...] (M = largest group, NaN padding), plus each row's (group,
    slot) so that ``padded[inv, slot] == r``."""
    inv, n = _dense(group_id)
    counts = torch.bincount(inv, minlength=n)
    order = torch.argsort(inv, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(inv)
    slot[order] = torch.arange(len(inv), device=inv.device) - starts[inv[order]]
    m = int(counts.max()) if n else 0
    out = torch.full((n, m) + r.shape[1:], float("nan"), dtype=torch.float64, device=r.device)
    out[inv, slot] = r.double()
    return out, inv, slot


# ----------------------------------------------------------------------------- estimators


@register_estimator("grpo")
def grpo(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """GRPO (DeepSeekMath): A_i = (r_i - mean_g r) / (std r + eps), std per `opts.std`
    (group, whole batch, or none)."""
    _check(r, group_id)
    _, _, mean, std = _group_moments(r, group_id)
    return _finish(_scale(r.double() - mean, r, std, opts), r)


@register_estimator("dr_grpo")
def dr_grpo(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """Dr. GRPO ('Understanding R1-Zero-like training'): A_i = r_i - mean_g r; never divides by a
    std (ignores `opts.std`)."""
    _check(r, group_id)
    _, _, mean, _ = _group_moments(r, group_id)
    return _finish(r.double() - mean, r)


@register_estimator("rloo")
def rloo(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """RLOO (REINFORCE leave-one-out): A_i = r_i - mean_{j != i in g} r_j; 0 when i has no valid
    group mate."""
    _check(r, group_id)
    total, cnt, _, _ = _group_moments(r, group_id)
    x = r.double()
    others = (total - torch.nan_to_num(x)) / (cnt - 1).clamp(min=1)
    return _finish(torch.where(cnt >= 2, x - others, 0.0), r)


@register_estimator("median")
def median(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """MC-GRPO (median-centred GRPO, Kim et al. 2026): every group has an odd size G+1; baseline =
    group median m_g. Exactly one pivot per group (the median element of the stable sort by
    reward, i.e. among ties the earliest row) gets advantage 0 and row_mask False. The normaliser
    (`opts.median_scale`): ``mad`` (the authors' code and paper) A_i = (r_i - m_g) / (MAD_g +
    1e-3) with MAD_g = median_j |r_j - m_g| over the group's G+1 rewards; ``std`` A_i = (r_i - m_g) /
    (std + eps) with std per `opts.std`. `opts.median_rescale` (the authors' GSM8K trainer) then
    multiplies the group's non-zero advantages (|A| > 1e-6) by (group size) / (their number).
    NaN rewards are left out of the medians (the lower median is taken if that leaves an even
    count); a group with no valid reward has no pivot. Needs one reward per rollout ([N])."""
    _check(r, group_id)
    if r.dim() != 1:
        raise ValueError("the median (MC-GRPO) estimator needs one reward per rollout ([N]); "
                         f"got shape {tuple(r.shape)}")
    row_mask = torch.ones(r.shape[0], dtype=torch.bool, device=r.device)
    baseline = torch.zeros(r.shape[0], dtype=torch.float64, device=r.device)
    mad = torch.zeros(r.shape[0], dtype=torch.float64, device=r.device)
    groups = []
    for g in torch.unique(group_id):
        rows = (group_id == g).nonzero().flatten()
        if len(rows) % 2 == 0:
            raise ValueError(f"median (MC-GRPO) needs an odd group size G+1; "
                             f"group {int(g)} has size {len(rows)}")
        groups.append(rows)
        rows = rows[~r[rows].isnan()]
        if len(rows) == 0:
            continue
        order = torch.sort(r[rows], stable=True).indices
        pivot = rows[order[(len(rows) - 1) // 2]]
        baseline[rows] = r[pivot].double()
        deviations = torch.sort((r[rows].double() - baseline[pivot]).abs()).values
        mad[rows] = deviations[(len(rows) - 1) // 2]
        row_mask[pivot] = False
    if opts.median_scale == "mad":
        adv = (r.double() - baseline) / (mad + MAD_EPS)
    else:
        _, _, _, std = _group_moments(r, group_id)
        adv = _scale(r.double() - baseline, r, std, opts)
    adv, _ = _finish(torch.where(row_mask, adv, 0.0), r)
    if opts.median_rescale:
        for rows in groups:
            nonzero = adv[rows].abs() > 1e-6
            if nonzero.any():
                adv[rows] = torch.where(nonzero, adv[rows] * (len(rows) / int(nonzero.sum())), adv[rows])
    return adv, row_mask


@register_estimator("pairwise")
def pairwise(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """2-GRPO ('It Takes Two: Your GRPO Is Secretly DPO'): A_i = mean_{j != i in g} sign(r_i - r_j)
    over the valid group mates; at G = 2 this is +-1 when the rewards differ and 0 when equal.
    Ignores `opts.std`."""
    _check(r, group_id)
    pad, inv, slot = _padded(r, group_id)                      # [G, M, ...]
    diff = pad.unsqueeze(2) - pad.unsqueeze(1)                 # [G, M(i), M(j), ...]
    m = pad.shape[1]
    other = ~torch.eye(m, dtype=torch.bool, device=r.device).view((1, m, m) + (1,) * (r.dim() - 1))
    valid = ~diff.isnan() & other
    wins = torch.where(valid, torch.sign(torch.nan_to_num(diff)), 0.0).sum(2)
    count = valid.sum(2).clamp(min=1)
    return _finish((wins / count)[inv, slot], r)


@register_estimator("ngrpo")
def ngrpo(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """NGRPO: a virtual sample with reward `max_reward` joins each group for the mean and the
    unbiased std over the G+1 values: A_i = (r_i - mean') / (std' + eps), so an all-wrong group
    still gets (negative) advantages. std' per `opts.std` ("batch" and "none" as in grpo)."""
    _check(r, group_id)
    _, cnt, mean, std = _group_moments(r, group_id)
    top = float(opts.max_reward)
    mean_v = (mean * cnt + top) / (cnt + 1)
    # sum of squared deviations of the G valid values and the virtual one about mean'
    ss = std.pow(2) * (cnt - 1).clamp(min=0) + cnt * (mean - mean_v).pow(2) + (top - mean_v).pow(2)
    std_v = (ss / cnt.clamp(min=1)).sqrt()                     # (G + 1) - 1 degrees of freedom
    return _finish(_scale(r.double() - mean_v, r, std_v, opts), r)


@register_estimator("step")
def step(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """Step level (TP-GRPO, TempFlow-GRPO): rewards [N, U]; for each group and unit index u,
    A_iu = (r_iu - mean_g r_.u) / (std_g r_.u + eps), std per `opts.std`."""
    if r.dim() != 2:
        raise ValueError(f"the step estimator needs per-unit rewards [N, U]; got shape {tuple(r.shape)}")
    return grpo(r, group_id, opts)


# ----------------------------------------------------------------------------- combining


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
    inv, n = _dense(group_id)
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


def compute_advantages(rewards: dict[str, Tensor], weights: dict[str, float], group_id: Tensor,
                       cfg) -> AdvantageResult:
    """Advantages for a batch of named rewards ([N] or [N, U] each; NaN = not applicable).

    cfg (an `AlgorithmConfig`): ``estimator`` (a name in ADVANTAGE_ESTIMATORS), ``std``, ``eps``,
    ``max_reward``; ``reward_combine`` "sum" (estimate on the weighted sum), "advantage"
    (estimate each reward, then the weighted sum of advantages: DanceGRPO video, MixGRPO; row_mask
    is the AND), "gate" (estimate on `gated_total` with ``gates``: Vision-R1) or "product"
    (estimate on `product_total`); ``drop_zero_variance`` (DAPO: groups whose totals are all equal get advantage 0
    and row_mask False); ``clip_advantage`` c (clamp to [-c, c]; Flow-GRPO uses 5). Rows whose
    total is NaN (for [N, U]: in every unit) get row_mask False. Advantages are 0 outside
    row_mask. Stats: advantage_mean / _std / _abs_mean over the rows in row_mask,
    zero_variance_frac (groups whose totals are all equal), num_groups.
    """
    # Built-ins are found without importing the plugins (a plugin cannot replace a built-in).
    estimator = ADVANTAGE_ESTIMATORS.get(cfg.estimator)
    opts = AdvantageOptions(std=cfg.std, eps=cfg.eps, max_reward=cfg.max_reward,
                            median_scale=cfg.median_scale, median_rescale=cfg.median_rescale)
    rs = _broadcast(rewards)
    check_reward_combine(cfg.reward_combine, cfg.gates, weights)
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
        row_mask = row_mask & informative[_dense(group_id)[0]]
    row_mask = row_mask & ~(total.isnan() if total.dim() == 1 else total.isnan().all(1))
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
