"""Scoring a draw's rollouts generation call by generation call (`scoring.overlap`).

With overlap, each call's rollout is handed to one background thread as soon as it is generated
and scored there while the next call generates; without it, the calls' rollouts are joined and
scored once after the last call. Either way the rows, their rewards and the counts the rewards log
come out in generation order, and a reward sees whole prompt groups. Only this process's rewards
run in the thread: every gather across processes stays in the main thread, after `scored`.
A reward's exception is raised again in the main thread, the same exception with its message, at
the next call's hand-over or at `scored`.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Mapping, Sequence

import torch
from torch import Tensor

from mmrl.core.rollout import Rollout
from mmrl.core.scoring import RewardFn, score_rollout

Scored = tuple[Rollout, dict[str, Tensor], dict[str, Tensor], dict[str, float]]  # kept rows, rewards, auxiliary rows' rewards, counts


def add_counts(into: dict[str, float], counts: dict[str, float]) -> None:
    """Add each of `counts` into `into` (a reward's or a policy's counters, summed over calls)."""
    for key, value in counts.items():
        into[key] = into.get(key, 0.0) + value


def place_call(rollout: Rollout, rows: list[dict], first_group: int) -> Rollout:
    """A generation call's rollout placed in its draw: group ids counted from the call's first group
    in the draw, and each row given its prompt's data columns (what the rewards read)."""
    rollout.group_id = rollout.group_id + first_group
    rollout.add_data_columns(rows)
    return rollout


def score_with_counts(fns: Mapping[str, RewardFn], rollout: Rollout) -> Scored:
    """`score_rollout` with the counts the rewards logged about this call."""
    counts: dict[str, float] = {}
    return (*score_rollout(fns, rollout, counts), counts)


class ChunkScorer:
    """Takes a draw's rollouts call by call (`add`) and gives the draw's scored rows (`scored`).
    Use as a context manager: leaving it stops the thread (pending calls are cancelled)."""

    def __init__(self, fns: Mapping[str, RewardFn], overlap: bool,
                 concat: Callable[[Sequence[Rollout]], Rollout]):
        self.fns, self.concat = fns, concat
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mmrl-reward") if overlap else None
        self.pending: list[Future] = []   # overlap: one scoring per call, in generation order
        self.rollouts: list[Rollout] = []  # no overlap: the calls' rollouts, scored together

    def __enter__(self) -> ChunkScorer:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def add(self, rollout: Rollout) -> None:
        """Hand over one generation call's rollout (whole prompt groups); first raise the error of
        any scoring that already failed."""
        if self.pool is None:
            self.rollouts.append(rollout)
            return
        for done in self.pending:
            if done.done() and done.exception() is not None:
                raise done.exception()
        self.pending.append(self.pool.submit(score_with_counts, self.fns, rollout))

    def add_scored(self, scored: Scored) -> None:
        """Hand over one generation call's rows already scored (by the rollout worker)."""
        done: Future = Future()
        done.set_result(scored)
        self.pending.append(done)

    def scored(self) -> Scored:
        """The draw's rows without auxiliary rows, their rewards, the auxiliary rows' rewards and
        the rewards' counts, rows in generation order (waits for the thread)."""
        if not self.pending:
            return score_with_counts(self.fns, self.join(self.rollouts))
        parts = [future.result() for future in self.pending]
        counts: dict[str, float] = {}
        for *_, part in parts:
            add_counts(counts, part)
        rewards = {k: torch.cat([p[1][k] for p in parts]) for k in parts[0][1]}
        auxiliary = {k: torch.cat([p[2][k] for p in parts]) for k in parts[0][2]}
        return self.join([p[0] for p in parts]), rewards, auxiliary, counts

    def join(self, rollouts: list[Rollout]) -> Rollout:
        return self.concat(rollouts) if len(rollouts) > 1 else rollouts[0]
