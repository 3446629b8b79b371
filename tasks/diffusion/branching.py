"""BranchGRPO (Li et al. 2025, 'BranchGRPO: Stable and Efficient GRPO with Structured Branching in
Diffusion Models', github.com/Fredreic1849/BranchGRPO, `fastvideo/train_branchgrpo_flux.py`):
a group is a tree of rollouts sharing their prefixes.

Every group starts from one node (the group's initial noise). At each step listed in `at`, every
node splits into `factor` children (each drawing its own step noise, scaled by `noise_scale`);
at the other steps each node has one child. The leaves, factor ** len(at) of them, are the
group's rows; rows under one node hold the same latents up to its depth, and the denoiser runs
once per node and step (`representatives`).

The state after step k is at depth k + 1, so a unit k (step x_k -> x_{k+1}) is the edge into a
node at depth k + 1. Tree advantages (the authors' `compute_node_rewards_from_leaves` and
`compute_hierarchical_advantages_by_depth`): a node's reward is the mean reward of the leaves
below it; at each depth the group's nodes are normalised together, (r - mean) / (std + eps), std
unbiased. Each edge is trained once, as the authors collect each parent-child transition once:
unit k is carried by the first row under its node (`node_rewards` gives NaN, `edge_owners`
False, on the other rows), so that an estimator taking statistics per unit over the group's
non-NaN values (`grpo`, `step`) normalises over the depth's nodes. Every edge is trained, the
last step's (each leaf's own) included, as the authors' `collect_all_transitions` takes them all
(`train_last_step`; without a tree the last step is never trained).

Depth pruning (`--depth_pruning`, `--depth_pruning_slide`): units whose child depth is in
`depth_pruning` are not trained; with `prune_slide_every` n > 0 the depths move s = min(step // n,
min(depth_pruning) - stop) shallower by training step, stop = `prune_stop_depth` or max(at).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmrl.core.rollout import Rollout


@dataclass
class Branching:
    at: list[int] = field(default_factory=list, metadata={"help": (
        "BranchGRPO: the denoising steps at which every node of a group's tree splits into `factor` children "
        "(the authors' tree_split_points, e.g. [0, 3, 6, 9] of 20 steps); empty: no tree. The group size must be "
        "factor ** len(at).")})
    factor: int = field(default=2, metadata={"help": (
        "BranchGRPO: children of a node at a split step (the authors split in 2).")})
    noise_scale: float = field(default=1.0, metadata={"help": (
        "BranchGRPO: the split steps draw noise times this (the authors' tree_split_noise_scale: 4.0 in their "
        "script, 0.3 their argparse default); the log-prob keeps the sampler's std, as theirs. 1: the sampler's "
        "own step.")})
    depth_pruning: list[int] = field(default_factory=list, metadata={"help": (
        "BranchGRPO depth pruning: the depths (the state after step d - 1) whose incoming steps are not trained "
        "(the authors' depth_pruning, e.g. [15, 16, 17]); sampling and rewards are unchanged.")})
    prune_slide_every: int = field(default=0, metadata={"help": (
        "BranchGRPO: move the pruned depths one shallower every this many training steps (the authors' "
        "depth_pruning_slide with depth_pruning_slide_interval, 30 in their script); 0: fixed depths.")})
    prune_stop_depth: int | None = field(default=None, metadata={"help": (
        "BranchGRPO: the sliding pruned depths stop when the shallowest reaches this depth (the authors' "
        "depth_pruning_stop_depth); null: max(at).")})
    train_last_step: bool = field(default=True, metadata={"help": (
        "BranchGRPO: train the last denoising step too, each leaf's own edge, as the authors train every edge "
        "of the tree (16 of the 218 edges of their 20-step tree of 16 leaves); false: leave it untrained, as "
        "mmrl's step schedules do without a tree (policy.schedule).")})

    def __post_init__(self):
        if self.factor < 2:
            raise ValueError(f"policy.branching.factor={self.factor} must be >= 2")
        if len(set(self.at)) != len(self.at) or any(k < 0 for k in self.at):
            raise ValueError(f"policy.branching.at={self.at} must list distinct steps >= 0")
        if self.noise_scale <= 0:
            raise ValueError(f"policy.branching.noise_scale={self.noise_scale} must be > 0")
        if self.prune_slide_every < 0:
            raise ValueError(f"policy.branching.prune_slide_every={self.prune_slide_every} must be >= 0")
        if (self.depth_pruning or self.prune_slide_every) and not self.at:
            raise ValueError("policy.branching.depth_pruning needs a tree (policy.branching.at)")

    @property
    def on(self) -> bool:
        return bool(self.at)

    def problems(self, num_steps: int) -> list[str]:
        """What does not fit `num_steps`, one message per problem."""
        out = []
        if any(k >= num_steps for k in self.at):
            out.append(f"policy.branching.at={self.at}: a split step must be < policy.num_steps={num_steps}")
        if any(not 1 <= d <= num_steps for d in self.depth_pruning):
            out.append(f"policy.branching.depth_pruning={self.depth_pruning}: depths are 1 .. policy.num_steps="
                       f"{num_steps}")
        return out

    def group_size_problems(self, group_size: int) -> list[str]:
        """The leaves of the tree are the group: group_size = factor ** len(at)."""
        if self.on and group_size != self.factor ** len(self.at):
            return [f"algorithm.group_size={group_size}: policy.branching gives {self.factor} ** {len(self.at)} = "
                    f"{self.factor ** len(self.at)} leaves per group"]
        return []

    def widths(self, num_steps: int) -> list[int]:
        """Nodes per group at depths 0 .. num_steps."""
        out = [1]
        for k in range(num_steps):
            out.append(out[-1] * (self.factor if k in self.at else 1))
        return out

    def pruned_depths(self, training_step: int) -> set[int]:
        """The depths whose incoming steps this training step does not train."""
        if not self.depth_pruning:
            return set()
        shift = 0
        if self.prune_slide_every:
            stop = max(self.at) if self.prune_stop_depth is None else self.prune_stop_depth
            shift = min(training_step // self.prune_slide_every, max(0, min(self.depth_pruning) - stop))
        return {d - shift for d in self.depth_pruning}


def first_rows(group_size: int, num_groups: int, width: int) -> Tensor:
    """long [N]: for each row, the first row of its node when a group has `width` nodes (rows
    of a node are consecutive)."""
    block = group_size // width
    rows = torch.arange(num_groups * group_size)
    return rows - rows % block


def representatives(owner: Tensor) -> tuple[Tensor, Tensor]:
    """(the rows that stand for their node [M], each row's position among them [N]) from the
    first-row map `owner` [N]."""
    reps, index = torch.unique(owner, return_inverse=True)
    return reps, index


def edge_owners(branching: Branching, group_size: int, num_groups: int, num_steps: int) -> Tensor:
    """bool [N, U]: unit k of a row is its node's edge into depth k + 1 carried by that row (the
    first row under the node)."""
    widths = branching.widths(num_steps)
    rows = torch.arange(num_groups * group_size)
    return torch.stack([first_rows(group_size, num_groups, widths[k + 1]) == rows for k in range(num_steps)], 1)


def node_rewards(rewards: Tensor, branching: Branching, group_size: int, num_steps: int) -> Tensor:
    """[N, U] from the leaves' rewards [N]: unit k of a row owning its edge gets the mean reward
    of the leaves under the node at depth k + 1; NaN on the other rows."""
    n = rewards.shape[0]
    widths, num_groups = branching.widths(num_steps), n // group_size
    out = torch.full((n, num_steps), float("nan"), dtype=rewards.dtype)
    for k in range(num_steps):
        block = group_size // widths[k + 1]
        means = rewards.view(-1, block).mean(1)  # one per node, groups in order
        owners = first_rows(group_size, num_groups, widths[k + 1])
        out[owners.unique(), k] = means
    return out


def pruned_units(branching: Branching, training_step: int, num_steps: int) -> Tensor:
    """bool [U]: the steps depth pruning leaves untrained."""
    depths = branching.pruned_depths(training_step)
    return torch.tensor([k + 1 in depths for k in range(num_steps)], dtype=torch.bool)


def tree_widths(tree: Branching | None, group_size: int, steps: int, stochastic: Tensor) -> list[int]:
    """Nodes per group at depths 0 .. steps: the tree's, or one per row; every split step must be a
    stochastic step (bool [N, U]) of every rollout."""
    if tree is None:
        return [group_size] * (steps + 1)
    problems = tree.problems(steps) + tree.group_size_problems(group_size)
    if problems:
        raise ValueError("; ".join(problems))
    if not stochastic[:, tree.at].all():
        raise ValueError(f"policy.branching.at={tree.at}: every split step must be a stochastic (SDE) step of "
                         "every rollout under policy.schedule (a split at an ODE step would give equal children)")
    return tree.widths(steps)


def tree_rewards(tree: Branching, batch: Rollout, rewards: dict[str, Tensor]) -> dict[str, Tensor] | None:
    """Each unit's reward {name: [N, U]} from the rollouts' {name: [N]}: the mean over the leaves
    under its tree node, on the row that carries the edge, NaN on the rows sharing it; None
    without a tree."""
    if not tree.on:
        return None
    group_size = tree.factor ** len(tree.at)
    return {name: node_rewards(v, tree, group_size, batch.num_units) for name, v in rewards.items()}
