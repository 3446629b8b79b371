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

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from mmrl.registry import Registry

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
    batch (Flow-GRPO's global std; per unit index for [N, U]), "none" does not divide. ddof: the
    stds' delta degrees of freedom, 1 unbiased (Bessel's correction, as TRL), 0 the population std
    (numpy's, as Flow-GRPO's and DiffusionNFT's stat tracker); fewer than 2 valid values give std 0.
    eps: added to the std. max_reward: NGRPO's virtual sample.
    median_scale, median_rescale: the MC-GRPO (`median`) estimator's normaliser and rescale.
    """

    std: str = "group"
    eps: float = 1e-4
    ddof: int = 1
    max_reward: float = 1.0
    median_scale: str = "mad"
    median_rescale: bool = False

    def __post_init__(self):
        if self.std not in STD_MODES:
            raise ValueError(f"algorithm.std={self.std!r} is not one of {', '.join(STD_MODES)}")
        if self.median_scale not in MEDIAN_SCALES:
            raise ValueError(f"algorithm.median_scale={self.median_scale!r} is not one of {', '.join(MEDIAN_SCALES)}")
        if self.ddof not in (0, 1):
            raise ValueError(f"algorithm.std_ddof={self.ddof!r} is not one of 0, 1")


def group_index(group_id: Tensor) -> tuple[Tensor, int]:
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


def _group_moments(r: Tensor, group_id: Tensor, ddof: int = 1) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per row, in float64: nan-aware group (sum, count, mean, std with `ddof`; std 0 when count < 2)."""
    inv, n = group_index(group_id)
    valid = ~r.isnan()
    x = torch.where(valid, r.double(), 0.0)
    cnt = _seg_sum(valid.double(), inv, n)
    total = _seg_sum(x, inv, n)
    mean = total / cnt.clamp(min=1)
    dev = torch.where(valid, x - mean[inv], 0.0)
    var = _seg_sum(dev * dev, inv, n) / (cnt - ddof).clamp(min=1)
    std = torch.where(cnt >= 2, var.sqrt(), 0.0)
    return total[inv], cnt[inv], mean[inv], std[inv]


def _batch_std(r: Tensor, ddof: int = 1) -> Tensor:
    """Nan-aware std with `ddof` over dim 0 (a scalar for [N], one per unit for [N, U]), float64."""
    valid = ~r.isnan()
    x = torch.where(valid, r.double(), 0.0)
    cnt = valid.sum(0).double()
    mean = x.sum(0) / cnt.clamp(min=1)
    dev = torch.where(valid, x - mean, 0.0)
    var = (dev * dev).sum(0) / (cnt - ddof).clamp(min=1)
    return torch.where(cnt >= 2, var.sqrt(), 0.0)


def _scale(centered: Tensor, r: Tensor, group_std: Tensor, opts: AdvantageOptions) -> Tensor:
    if opts.std == "group":
        return centered / (group_std + opts.eps)
    if opts.std == "batch":
        return centered / (_batch_std(r, opts.ddof) + opts.eps)
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
    inv, n = group_index(group_id)
    counts = torch.bincount(inv, minlength=n)
    order = torch.argsort(inv, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(inv)
    slot[order] = torch.arange(len(inv), device=inv.device) - starts[inv[order]]
    m = int(counts.max()) if n else 0
    out = torch.full((n, m) + r.shape[1:], float("nan"), dtype=torch.float64, device=r.device)
    out[inv, slot] = r.double()
    return out, inv, slot


@register_estimator("grpo")
def grpo(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """GRPO (DeepSeekMath): A_i = (r_i - mean_g r) / (std r + eps), std per `opts.std`
    (group, whole batch, or none)."""
    _check(r, group_id)
    _, _, mean, std = _group_moments(r, group_id, opts.ddof)
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
        _, _, _, std = _group_moments(r, group_id, opts.ddof)
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
    std (`opts.ddof`) over the G+1 values: A_i = (r_i - mean') / (std' + eps), so an all-wrong group
    still gets (negative) advantages. std' per `opts.std` ("batch" and "none" as in grpo)."""
    _check(r, group_id)
    _, cnt, mean, std = _group_moments(r, group_id)
    top = float(opts.max_reward)
    mean_v = (mean * cnt + top) / (cnt + 1)
    # sum of squared deviations of the G valid values and the virtual one about mean'
    ss = std.pow(2) * (cnt - 1).clamp(min=0) + cnt * (mean - mean_v).pow(2) + (top - mean_v).pow(2)
    std_v = (ss / (cnt + 1 - opts.ddof).clamp(min=1)).sqrt()   # (G + 1) - ddof degrees of freedom
    return _finish(_scale(r.double() - mean_v, r, std_v, opts), r)


@register_estimator("step")
def step(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """Step level (TP-GRPO, TempFlow-GRPO): rewards [N, U]; for each group and unit index u,
    A_iu = (r_iu - mean_g r_.u) / (std_g r_.u + eps), std per `opts.std`."""
    if r.dim() != 2:
        raise ValueError(f"the step estimator needs per-unit rewards [N, U]; got shape {tuple(r.shape)}")
    return grpo(r, group_id, opts)
