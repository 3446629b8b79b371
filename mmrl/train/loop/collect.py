"""A step's rollouts and rewards: prompt groups drawn, rolled out on this process's share, scored,
the whole draw's rewards gathered; with DAPO dynamic sampling, drawn again until enough groups have
reward variance. A draw is generated in calls of `scoring.groups_per_call` groups, each call's
groups scored while the next generate (`scoring.overlap`, `chunk_scoring`).

Distribution: the step's prompt groups are split into contiguous blocks, one per process; each
group is sampled from its own seed (run seed, step, attempt, group index), so rollouts do not
depend on the number of processes. Rewards are gathered so every process computes the same
advantages over the whole batch.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmrl.config.sections import TrainConfig
from mmrl.core.advantages import combined_total, group_variance_mask
from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout, staleness_metrics
from mmrl.core.scoring import RewardFn, score_completions
from mmrl.core.seeding import derive_seed
from mmrl.data.sampler import PromptSampler
from mmrl.distributed.gather import gather_objects
from mmrl.distributed.strategy import Strategy
from mmrl.train.loop.records import Collected, Draw
from mmrl.train.loop.step_clock import StepClock
from mmrl.train.placement.chunk_scoring import ChunkScorer, add_counts, place_call
from mmrl.train.placement.rollout_worker import RolloutWorker, WorkerScores


@dataclass
class StageInputs:
    """What the current stage draws from and scores with (replaced when a stage changes them)."""

    cfg: TrainConfig
    reward_fns: dict[str, RewardFn]
    reward_weights: dict[str, float]
    train_rows: Any                # mmrl.data.Rows
    eval_rows: Any                 # mmrl.data.Rows
    sampler: PromptSampler
    bench: Any = None              # mmrl.train.loop.benchmark_pass.PeriodicBench (eval.bench), or None


def generation_calls(groups: range, per_call: int) -> list[range]:
    """`groups` split into consecutive runs of `per_call` groups (0: one run of them all)."""
    per_call = per_call or len(groups)
    return [groups[i:i + per_call] for i in range(0, len(groups), per_call)]


class RolloutCollector:
    """Rolls out and scores this process's share of each step's prompt groups."""

    def __init__(self, strategy: Strategy, policy: Policy, model: torch.nn.Module, clock: StepClock):
        self.strategy, self.policy, self.model, self.clock = strategy, policy, model, clock
        self.idle_row = None  # a row of this process's latest draw (lockstep passes at zero)
        self.worker: RolloutWorker | None = None  # rollout.mode one_step_off / async: who generates
        self.prefetched: dict[int, list[int]] = {}  # step -> its prompts, drawn ahead for the worker

    def rollout_params(self):
        """Whole parameters for rollouts and evaluation where the strategy shards them, unless the
        policy samples with an engine of its own (vLLM), whose weight sync reads one unit at a time."""
        return self.strategy.gathered(self.model) if self.policy.rollout_runs_model else nullcontext()

    def _local_groups(self, num_groups: int) -> range:
        acc = self.strategy.acc
        per = num_groups // acc.num_processes
        return range(acc.process_index * per, (acc.process_index + 1) * per)

    def draw(self, inputs: StageInputs, step: int, attempt: int) -> Draw:
        """Roll out this process's groups of one draw and score them; the rewards of the whole draw
        are gathered (global row order), its auxiliary rows' rewards too (dropped from the rollout).
        1. generate the groups call by call (`scoring.groups_per_call`; a rollout worker or servers
           are asked for every call first), each call's rollout handed to the scorer (scored in a
           background thread meanwhile with `scoring.overlap`);
        2. the scored rows; 3. step-level rewards, where the adapter has them; 4. the gathers."""
        cfg = inputs.cfg
        prefetched = self.prefetched.pop(step, None) if attempt == 0 else None
        indices = inputs.sampler.draw(step, cfg.optim.prompts_per_step, attempt) if prefetched is None else prefetched
        calls = generation_calls(self._local_groups(len(indices)), cfg.scoring.groups_per_call)
        if self.worker is not None:  # every call asked at once: several rollout servers draw them side by side
            for groups in calls:
                self._ask(inputs, indices, groups, step, attempt)
        with ChunkScorer(inputs.reward_fns, cfg.scoring.overlap, self.policy.concat) as scorer:
            with self.rollout_params():
                for groups in calls:
                    rollout, scores = self._generate(inputs, indices, groups, step, attempt)
                    scorer.add(rollout) if scores is None else scorer.add_scored((rollout, *scores))
            with self.clock.phase("reward"):
                rollout, rewards, auxiliary, counts = scorer.scored()
        # turning-point passes: as many as each process's samples need (an adapter without step rewards runs none)
        step_level = type(self.policy).step_rewards is not Policy.step_rewards
        with self.strategy.gathered(self.model, always=True) if step_level else nullcontext(), \
                self.clock.phase("reward"):
            per_unit = self.policy.step_rewards(rollout, lambda picked, completions: score_completions(
                inputs.reward_fns, rollout, picked, completions, counts))
        if per_unit is None:  # per-unit rewards the adapter derives from the rollout rewards (BranchGRPO)
            per_unit = self.policy.unit_rewards(rollout, rewards)
        if per_unit is not None:  # step-level credit: these replace the rollout rewards
            rewards = per_unit
        counts.update({f"policy/{k}": v for k, v in self._policy_counts().items()})
        gathered = gather_objects(self.strategy.acc, ({k: v.tolist() for k, v in rewards.items()}, counts,
                                                      {k: v.tolist() for k, v in auxiliary.items()}))
        metrics: dict[str, float] = {}
        for _, part, _ in gathered:
            add_counts(metrics, part)
        return Draw(rollout, indices,
                    {k: torch.tensor([x for part, _, _ in gathered for x in part[k]]) for k in rewards}, metrics,
                    {k: torch.tensor([x for _, _, part in gathered for x in part[k]]) for k in auxiliary})

    def _policy_counts(self) -> dict[str, float]:
        """The policy's counts of this draw (`Policy.pop_metrics`): the trainer's policy's (its step
        rewards), with the rollout worker's policy's (its rollouts) where a worker generates."""
        counts = dict(self.policy.pop_metrics())
        for name, value in (self.worker.pop_metrics() if self.worker is not None else {}).items():
            counts[name] = counts.get(name, 0.0) + value
        return counts

    def _generate(self, inputs: StageInputs, indices: list[int], groups: range, step: int,
                  attempt: int) -> tuple[Rollout, WorkerScores | None]:
        """One generation call: the rollouts of the draw's groups `groups` (global group ids), with
        their data columns; and their scores where the rollout worker scored them (else None)."""
        cfg = inputs.cfg
        rows = [inputs.train_rows[indices[g]] for g in groups]
        seeds = [derive_seed(cfg.seed, step, attempt, g) for g in groups]
        scores = None
        with self.clock.phase("generate"):
            if self.worker is not None:  # stamped by the worker with the version of its weights
                rollout, scores = self.worker.take_scored((step, attempt, groups.start), rows, cfg.algorithm.group_size,
                                                          seeds)
            else:
                rollout = self.policy.rollout(rows, cfg.algorithm.group_size, seeds)
                rollout.stamp_version(step - 1)  # drawn by the weights after step - 1 updates
        self.idle_row = rollout.select([0])
        if scores is None:
            place_call(rollout, rows, groups.start + attempt * len(indices))
        else:  # the worker counted the group ids in the draw (its modes draw once: attempt 0)
            rollout.add_data_columns(rows)
        return rollout, scores

    def _ask(self, inputs: StageInputs, indices: list[int], groups: range, step: int, attempt: int) -> None:
        """Ask the rollout worker or servers for a generation call's groups, unless they were asked for already."""
        key = (step, attempt, groups.start)
        if not self.worker.has_asked(key):
            cfg = inputs.cfg
            self.worker.ask(key, [inputs.train_rows[indices[g]] for g in groups], cfg.algorithm.group_size,
                            [derive_seed(cfg.seed, step, attempt, g) for g in groups])

    def prefetch_after(self, inputs: StageInputs, collected: int, last: int) -> None:
        """Draw the prompts of the steps after `collected` up to `last` not drawn yet, in order, and
        ask the worker for the rollouts of those it was not asked for (a resumed run's drawn-ahead
        steps included); they are generated while the trainer trains."""
        cfg = inputs.cfg
        for step in range(collected + 1, last + 1):
            if step not in self.prefetched:
                self.prefetched[step] = inputs.sampler.draw(step, cfg.optim.prompts_per_step, 0)
            if not self.worker.asked_for(step):
                indices = self.prefetched[step]
                for groups in generation_calls(self._local_groups(len(indices)), cfg.scoring.groups_per_call):
                    self._ask(inputs, indices, groups, step, 0)

    def collect(self, inputs: StageInputs, step: int) -> Collected:
        """This process's rollouts, and the WHOLE batch's rewards and group ids, for a step; with
        DAPO dynamic sampling, keep drawing until `prompts_per_step` groups have non-zero reward
        variance (or tries run out). Group ids are unique across draws."""
        cfg, samp = inputs.cfg, inputs.cfg.sampling
        need, group_size = cfg.optim.prompts_per_step, cfg.algorithm.group_size
        local_parts, reward_parts, gid_parts, draws = [], [], [], []
        kept = dropped = 0
        for attempt in range(samp.dynamic_max_tries if samp.dynamic else 1):
            draw = self.draw(inputs, step, attempt)
            draws.append(draw)
            offset = attempt * len(draw.indices)
            draw_gid = torch.arange(len(draw.indices)).repeat_interleave(group_size)
            stale = self._stale_groups(cfg, draw, offset, step)
            dropped += int(stale.sum()) * group_size
            keep = self._kept_groups(inputs, draw, draw_gid, need - kept) & ~stale
            local_part = draw.rollout.select(keep[draw.rollout.group_id - offset].nonzero().flatten())
            if len(local_part):
                local_parts.append(local_part)
            reward_parts.append({k: v[keep[draw_gid]] for k, v in draw.rewards.items()})
            gid_parts.append((draw_gid + offset)[keep[draw_gid]])
            kept += int(keep.sum())
            if kept >= need:
                break
        if not local_parts:  # this process kept no group: an empty rollout of the right kind
            local_parts.append(draws[-1].rollout.select([]))
        local = self.policy.concat(local_parts) if len(local_parts) > 1 else local_parts[0]
        rewards = {k: torch.cat([p[k] for p in reward_parts]) for k in reward_parts[0]}
        stats = self._stats(inputs, draws, kept)
        if cfg.rollout.mode == "async":
            stats["rollout/stale_dropped"] = float(dropped)
        versions = gather_objects(self.strategy.acc, local.weights_version.tolist())
        stats.update(staleness_metrics(torch.tensor([v for part in versions for v in part]), step - 1))
        return Collected(local, rewards, torch.cat(gid_parts), stats)

    @staticmethod
    def _stale_groups(cfg: TrainConfig, draw: Draw, offset: int, step: int) -> Tensor:
        """bool [groups]: the draw's groups that `rollout.stale_rows: drop` leaves out, those drawn by
        weights more than `rollout.max_staleness` steps older than the step's (async; one process)."""
        stale = torch.zeros(len(draw.indices), dtype=torch.bool)
        ro = cfg.rollout
        if ro.mode == "async" and ro.stale_rows == "drop":
            too_old = draw.rollout.weights_version < step - 1 - ro.max_staleness
            stale[draw.rollout.group_id[too_old] - offset] = True
        return stale

    def _kept_groups(self, inputs: StageInputs, draw: Draw, draw_gid: Tensor, room: int) -> Tensor:
        """bool [groups]: the draw's groups the step keeps (all, or under dynamic sampling those with
        reward variance, no more than `room`); the sampler learns the draw's outcomes."""
        cfg = inputs.cfg
        algo, samp = cfg.algorithm, cfg.sampling
        total = combined_total(draw.rewards, inputs.reward_weights, algo.reward_combine, algo.gates)
        outcome = total if samp.variance_reward is None else draw.rewards[samp.variance_reward]
        inputs.sampler.update(draw.indices, outcome if outcome.dim() == 1 else outcome.nanmean(1), draw_gid)  # [N, U]: row means
        keep = group_variance_mask(total, draw_gid) if samp.dynamic else torch.ones(len(draw.indices), dtype=torch.bool)
        return keep & (torch.cumsum(keep, 0) <= room)  # no more groups than the batch needs

    @staticmethod
    def _stats(inputs: StageInputs, draws: list[Draw], kept: int) -> dict[str, float]:
        """The step's sampling metrics; under dynamic sampling `sampling/rewarded_frac`, the share of
        the drawn rows some reward gave a value (0: no group was kept because no reward gave any)."""
        stats = {"sampling/tries": float(len(draws)), "sampling/groups": float(kept)}
        if inputs.cfg.sampling.dynamic:
            algo = inputs.cfg.algorithm
            totals = [combined_total(d.rewards, inputs.reward_weights, algo.reward_combine, algo.gates) for d in draws]
            rewarded = [~(t.isnan() if t.dim() == 1 else t.isnan().all(1)) for t in totals]
            stats["sampling/rewarded_frac"] = float(torch.cat(rewarded).float().mean()) if totals else 0.0
        for draw in draws:
            add_counts(stats, draw.metrics)
        for k in draws[0].auxiliary:  # e.g. T-GRPO's shuffled-frame accuracy beside reward/<name>
            values = torch.cat([d.auxiliary[k] for d in draws])
            if not values.isnan().all():
                stats[f"auxiliary/reward/{k}"] = float(values.nanmean())
        stats.update(inputs.sampler.stats())
        return stats
