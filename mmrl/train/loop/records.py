"""The records a training step's phases hand each other (mmrl/train/loop/trainer.py numbers the phases)."""

from __future__ import annotations

from dataclasses import dataclass
from torch import Tensor

from mmrl.core.rollout import Rollout


@dataclass
class Draw:
    """One draw of prompt groups: this process's rollouts, and the whole draw's rewards."""

    rollout: Rollout               # this process's rows of the draw
    indices: list[int]             # the drawn prompts' rows in the data set, one per group (whole draw)
    rewards: dict[str, Tensor]     # reward name -> [N] or [N, U], every process's rows in global order
    metrics: dict[str, float]      # what the rewards and the policy logged, summed over processes
    auxiliary: dict[str, Tensor]   # reward name -> [M]: the whole draw's auxiliary rows (not trained)


@dataclass
class Collected:
    """A step's rollouts after dynamic sampling: this process's rows and the whole batch's rewards."""

    rollout: Rollout               # this process's kept rows
    rewards: dict[str, Tensor]     # reward name -> [N] or [N, U] over the whole batch
    group_id: Tensor               # [N] long: the whole batch's group ids, unique across draws
    metrics: dict[str, float]      # sampling/*, reward counters, auxiliary/reward/*


@dataclass
class StepBatch:
    """This process's share of a step, with the batch-wide quantities it needs."""

    rollout: Rollout               # local rows
    advantages: Tensor             # local [n] or [n, U]
    row_mask: Tensor               # local [n] bool: rows that take part in the loss
    weights: Tensor                # local [n, U]: aggregation weights over the whole batch
    metrics: dict[str, float]
    idle_row: Rollout | None = None  # a row of this process's latest draw: passes at zero when it kept none


@dataclass
class ShareCounts:
    """One process's share of a step's batch, gathered from every process before the loss so the
    aggregation is taken over the whole batch."""

    units: float                   # trained units (unit_mask x row_mask)
    rows: float                    # rows that take part in the loss
    width: int                     # U, the units of the widest rollout (0 for no rows)
    lengths: list[float]           # each row's unit count (completion length)
    truncated: list[bool]          # each row cut at the length limit (empty: not reported)


@dataclass
class MicroBatchCounts:
    """One process's micro-batch plan, gathered so every process runs as many backward passes."""

    chunks: int                    # micro-batches
    active: int                    # rows that run (carry a gradient)
    rows: int                      # rows that take part in the loss
