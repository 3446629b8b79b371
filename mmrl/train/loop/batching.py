"""A step's batch: advantages over the whole batch, this process's rows among them, and the
aggregation weights, whose normaliser is taken over every process's rows before the first
micro-batch (so that micro-batch losses sum to the one-batch loss)."""

from __future__ import annotations

import torch
from torch import Tensor

from mmrl.config.sections import TrainConfig
from mmrl.core.advantages import compute_advantages, row_magnitude
from mmrl.core.objectives import AGGREGATIONS
from mmrl.core.policy import Policy
from mmrl.distributed.gather import gather_objects
from mmrl.train.loop.records import Collected, ShareCounts, StepBatch


def batch_positions(batch_group_id: Tensor, local_group_id: Tensor) -> Tensor:
    """Where a process's rows sit in the whole batch: rows of a group keep their order, and
    groups are matched by id (under dynamic sampling a process's groups are not contiguous)."""
    positions = [(batch_group_id == g).nonzero().flatten() for g in torch.unique_consecutive(local_group_id)]
    return torch.cat(positions) if positions else torch.zeros(0, dtype=torch.long)


def local_advantages(collected: Collected, reward_weights: dict[str, float], cfg: TrainConfig, objective):
    """(this process's advantages [n] or [n, U], its row mask [n], the batch's advantage result)."""
    algo = cfg.algorithm
    adv = compute_advantages(collected.rewards, reward_weights, collected.group_id, algo)
    whole = adv.advantages
    if objective.row_coefficients is not None:
        if whole.dim() != 1:
            raise ValueError(f"algorithm.objective={algo.objective!r} needs one advantage per row, "
                             "not step-level rewards")
        whole = objective.row_coefficients(whole, collected.group_id, adv.row_mask)
    rows = batch_positions(collected.group_id, collected.rollout.group_id)
    advantages, row_mask = whole[rows], adv.row_mask[rows]
    if algo.prune_threshold > 0:
        row_mask = row_mask & ~(row_magnitude(advantages) < algo.prune_threshold)
    return advantages, row_mask, adv


def step_batch(collected: Collected, reward_weights: dict[str, float], cfg: TrainConfig, objective,
               policy: Policy, accelerator, idle_row=None) -> StepBatch:
    """This process's share of the step with its advantages and aggregation weights, and the
    step's reward, advantage and length metrics."""
    algo, local = cfg.algorithm, collected.rollout
    advantages, row_mask, adv = local_advantages(collected, reward_weights, cfg, objective)
    unit_mask = local.unit_mask * row_mask[:, None]
    counts: list[ShareCounts] = gather_objects(accelerator, ShareCounts(
        float(unit_mask.sum()), float(row_mask.sum()), local.num_units if len(local) else 0,
        local.unit_mask.sum(1).tolist(), local.truncated.tolist() if local.truncated is not None else []))
    max_units = algo.max_units or policy.max_units or max(c.width for c in counts)
    weights = AGGREGATIONS.get(algo.aggregation)(unit_mask, max(sum(c.units for c in counts), 1.0),
                                                 max(sum(c.rows for c in counts), 1.0), max_units)
    total = adv.total_reward
    metrics = collected.metrics
    metrics.update({
        "reward_mean": float(torch.nanmean(total)),
        "reward_std": float(total[~total.isnan()].std()) if (~total.isnan()).sum() > 1 else 0.0,
        **{f"reward/{k}": float(torch.nanmean(v)) for k, v in collected.rewards.items()},
        **adv.stats,
    })
    for key in [k for k in metrics if k.endswith("/sent_rows")]:  # a served reward's rows that got no answer
        for lost in ("failed", "unparsed"):
            if key.replace("sent", lost) in metrics or lost == "failed":
                metrics[key.replace("/sent_rows", f"/{lost}_frac")] = metrics.get(key.replace("sent", lost), 0.0) / \
                    max(metrics[key], 1.0)
    lengths = [x for c in counts for x in c.lengths]
    truncated = [x for c in counts for x in c.truncated]
    metrics["completion_length"] = sum(lengths) / max(len(lengths), 1)
    if truncated:
        metrics["truncated_frac"] = sum(truncated) / len(truncated)
    return StepBatch(local, advantages, row_mask, weights, metrics, idle_row)
