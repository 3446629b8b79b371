"""Advantage estimators over a reward tensor [N] or [N, U] and `group_id` [N]
(REFERENCES.md, 'Advantage estimators').

An estimator returns (advantages, row_mask): row_mask marks rows that take part in the loss
(False for MC-GRPO's pivot). NaN rewards mean "not applicable": they are left out of every
group statistic and get advantage 0. Statistics are taken within a group along dim 0,
independently for each trailing index, so every estimator also works column by column on [N, U].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from .registry import Registry

Estimator = Callable[[Tensor, Tensor, "AdvantageOptions"], tuple[Tensor, Tensor]]
ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    return ESTIMATORS.register(name)


@dataclass
class AdvantageOptions:
    std: str = "group"  # group | batch | none
    eps: float = 1e-4
    max_reward: float = 1.0


@dataclass
class AdvantageResult:
    advantages: Tensor
    row_mask: Tensor
    total_reward: Tensor
    stats: dict[str, float] = field(default_factory=dict)


def _groups(group_id: Tensor) -> tuple[Tensor, Tensor]:
    """(dense group index per row, number of groups)."""
    uniq, dense = torch.unique(group_id, return_inverse=True)
    return dense, torch.tensor(len(uniq))


def _group_sum(x: Tensor, dense: Tensor, n: int) -> Tensor:
    out = torch.zeros((n,) + x.shape[1:], dtype=x.dtype)
    return out.index_add_(0, dense, x)


def group_mean_std(r: Tensor, group_id: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row nan-aware group mean, unbiased group std, and count of valid values."""
    dense, n = _groups(group_id)
    valid = ~r.isnan()
    x = torch.where(valid, r, 0.0).double()
    cnt = _group_sum(valid.double(), dense, int(n))
    mean = _group_sum(x, dense, int(n)) / cnt.clamp(min=1)
    dev = torch.where(valid, x - mean[dense], 0.0)
    var = _group_sum(dev * dev, dense, int(n)) / (cnt - 1).clamp(min=1)
    std = torch.where(cnt >= 2, var.sqrt(), 0.0)
    return mean[dense].float(), std[dense].float(), cnt[dense].float()


def _scale(centered: Tensor, r: Tensor, group_std: Tensor, opts: AdvantageOptions) -> Tensor:
    if opts.std == "group":
        return centered / (group_std + opts.eps)
    if opts.std == "batch":
        valid = r[~r.isnan()]
        std = valid.std() if valid.numel() >= 2 else torch.tensor(0.0)
        return centered / (std + opts.eps)
    if opts.std == "none":
        return centered
    raise ValueError(f"algorithm.std={opts.std!r} is not one of group, batch, none")


def _finish(adv: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    adv = torch.where(r.isnan(), 0.0, adv)
    return adv, torch.ones(r.shape[0], dtype=torch.bool)


@register_estimator("grpo")
def grpo(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """A = (r - mean_g) / (std_g + eps)  (DeepSeekMath GRPO; std per group or whole batch)."""
    mean, std, _ = group_mean_std(r, group_id)
    return _finish(_scale(r - mean, r, std, opts), r)


@register_estimator("dr_grpo")
def dr_grpo(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """A = r - mean_g  (Dr. GRPO, 'Understanding R1-Zero-like training': no std division)."""
    mean, _, _ = group_mean_std(r, group_id)
    return _finish(r - mean, r)


@register_estimator("rloo")
def rloo(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """A_i = r_i - mean_{j != i} r_j  (REINFORCE leave-one-out)."""
    mean, _, cnt = group_mean_std(r, group_id)
    loo = (mean * cnt - torch.nan_to_num(r)) / (cnt - 1).clamp(min=1)
    adv = torch.where(cnt >= 2, r - loo, 0.0)
    return _finish(adv, r)


@register_estimator("median")
def median(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """MC-GRPO: G+1 rollouts, baseline = group median; A = (r - median) / (std + eps); the
    median 'pivot' rollout gets zero advantage and is left out of the loss."""
    if r.dim() != 1:
        raise ValueError("the median estimator takes one reward per rollout ([N]), not per unit")
    adv = torch.zeros_like(r)
    row_mask = torch.ones(r.shape[0], dtype=torch.bool)
    _, std, _ = group_mean_std(r, group_id)
    for g in torch.unique(group_id):
        rows = (group_id == g).nonzero().flatten()
        if len(rows) % 2 == 0:
            raise ValueError(f"median (MC-GRPO) needs an odd group size G+1; group {int(g)} has {len(rows)}")
        values = torch.nan_to_num(r[rows], nan=float("-inf"))
        order = torch.sort(values, stable=True).indices
        pivot = rows[order[len(rows) // 2]]
        adv[rows] = r[rows] - r[pivot]
        row_mask[pivot] = False
    adv = _scale(adv, r, std, opts)
    adv = torch.where(row_mask & ~r.isnan(), adv, 0.0)
    return adv, row_mask


@register_estimator("pairwise")
def pairwise(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """A_i = mean_{j != i} sign(r_i - r_j)  (2-GRPO, 'It Takes Two': +-1 at G = 2, 0 on ties)."""
    same = group_id[:, None] == group_id[None, :]
    same.fill_diagonal_(False)
    x = r.unsqueeze(1) - r.unsqueeze(0)  # [N, N, ...]
    valid = ~x.isnan()
    mask = same.view(same.shape + (1,) * (r.dim() - 1)) & valid
    sign = torch.where(mask, torch.sign(torch.nan_to_num(x)), 0.0)
    count = mask.sum(1).clamp(min=1)
    return _finish(sign.sum(1) / count, r)


@register_estimator("ngrpo")
def ngrpo(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """NGRPO: a virtual sample with reward `max_reward` joins each group's mean and std, so an
    all-wrong group still gets a (negative) signal: A = (r - mean') / (std' + eps)."""
    mean, std, cnt = group_mean_std(r, group_id)
    m = opts.max_reward
    mean_v = (mean * cnt + m) / (cnt + 1)
    # unbiased variance over the G valid values plus the virtual one
    ss = std.pow(2) * (cnt - 1).clamp(min=0) + cnt * (mean - mean_v).pow(2) + (m - mean_v).pow(2)
    std_v = (ss / cnt.clamp(min=1)).sqrt()
    return _finish(_scale(r - mean_v, r, std_v, opts), r)


@register_estimator("step")
def step(r: Tensor, group_id: Tensor, opts: AdvantageOptions) -> tuple[Tensor, Tensor]:
    """Step-level (TP-GRPO, TempFlow-GRPO): rewards [N, U], normalised per group and unit index."""
    if r.dim() != 2:
        raise ValueError(f"the step estimator needs per-unit rewards [N, U]; got shape {tuple(r.shape)}")
    return grpo(r, group_id, opts)


def row_magnitude(advantages: Tensor) -> Tensor:
    """max_u |A_iu| per row ([N]); zero means the row carries no policy gradient."""
    return advantages.abs() if advantages.dim() == 1 else advantages.abs().amax(dim=1)


def group_variance_mask(total: Tensor, group_id: Tensor) -> Tensor:
    """For each group id 0..max, True when its (non-NaN) rewards are not all equal; a group with
    no variance gives GRPO no gradient (DAPO dynamic sampling keeps only the others)."""
    n = int(group_id.max()) + 1 if len(group_id) else 0
    out = torch.zeros(n, dtype=torch.bool)
    flat = total if total.dim() == 2 else total[:, None]
    for g in range(n):
        rows = flat[group_id == g]
        for col in rows.T:
            col = col[~col.isnan()]
            if col.numel() >= 2 and bool((col != col[0]).any()):
                out[g] = True
                break
    return out


def weighted_total(rewards: dict[str, Tensor], weights: dict[str, float]) -> Tensor:
    """sum_k w_k r_k over the rewards that apply to each row (NaN where none applies); an [N]
    reward beside an [N, U] one is broadcast over units."""
    n = len(next(iter(rewards.values())))
    widths = [v.shape[1] for v in rewards.values() if v.dim() == 2]
    shape = (n, max(widths)) if widths else (n,)
    stacked = torch.stack([weights[k] * (v if v.dim() == len(shape) else v[:, None]).expand(shape).float()
                           for k, v in rewards.items()])
    return torch.where(stacked.isnan().all(0), torch.nan, stacked.nansum(0))


def compute_advantages(rewards: dict[str, Tensor], weights: dict[str, float], group_id: Tensor,
                       cfg) -> AdvantageResult:
    """Combine the rewards (weighted sum before normalisation, or per-reward advantages summed:
    DanceGRPO / MixGRPO), estimate, filter zero-variance groups, clip."""
    estimator = ESTIMATORS.get(cfg.estimator)
    opts = AdvantageOptions(std=cfg.std, eps=cfg.eps, max_reward=cfg.max_reward)
    n = len(group_id)
    total = weighted_total(rewards, weights)
    shape = total.shape
    rs = {k: (v if v.dim() == len(shape) else v[:, None]).expand(shape).float() for k, v in rewards.items()}
    if cfg.reward_combine == "sum":
        adv, row_mask = estimator(total, group_id, opts)
    elif cfg.reward_combine == "advantage":
        adv = torch.zeros(shape)
        row_mask = torch.ones(n, dtype=torch.bool)
        for k, v in rs.items():
            a, m = estimator(v, group_id, opts)
            adv = adv + weights[k] * a
            row_mask &= m
    else:
        raise ValueError(f"algorithm.reward_combine={cfg.reward_combine!r} is not one of sum, advantage")
    informative = group_variance_mask(total, torch.unique(group_id, return_inverse=True)[1])
    dense = torch.unique(group_id, return_inverse=True)[1]
    if cfg.drop_zero_variance:
        row_mask = row_mask & informative[dense]
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
