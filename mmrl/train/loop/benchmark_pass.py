"""A benchmark's prompts generated and scored with a policy in this process: what the stages of
`mmrl bench` run (mmrl/experiments/bench/) and what ``eval.bench`` runs at every ``eval.every``.

Sample k of the prompt with id ``ID`` is drawn from its own seed, derive_seed(seed, salt, ID's hash,
k), as a group of one: it depends on the prompt and the sample index alone, whatever the shard,
the batch or the process, so two runs (or a sharded and an unsharded one) agree.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from typing import Any, Callable, Mapping, Sequence

import torch

from mmrl.config.bench import BenchEvalConfig
from mmrl.core.bench_stats import bench_figures
from mmrl.core.benchmark import Benchmark, Row
from mmrl.core.policy import Policy
from mmrl.core.scoring import RewardFn, compute_rewards, get_reward
from mmrl.core.seeding import derive_seed
from mmrl.data.bench_rows import benchmark_rows
from mmrl.registry import BENCHMARKS
from mmrl.train.placement.bench_scoring import bench_metric_fns

BENCH_SEED_SALT = 0xBE7C


def sample_seed(seed: int, prompt_id: str, k: int) -> int:
    """The seed of sample `k` of prompt `prompt_id` (a stable hash of the id, not Python's `hash`)."""
    key = int.from_bytes(hashlib.blake2b(prompt_id.encode(), digest_size=8).digest(), "little")
    return derive_seed(seed, BENCH_SEED_SALT, key, k)


@torch.no_grad()
def generate_samples(policy: Policy, bench: Benchmark, rows: Sequence[Row], options: Mapping[str, Any], seed: int,
                     samples: int, greedy: bool, prompts_per_call: int = 16,
                     on_call: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """`samples` completions of every row, each ``{"id", "k", "seed", "prompt", "completion",
    "columns"}`` ("columns": what the policy said of the sample, e.g. an image's input size), in
    row order; `on_call(new_samples)` after each rollout call (progress, files)."""
    jobs = [(row, k) for row in rows for k in range(samples)]
    out: list[dict] = []
    for start in range(0, len(jobs), prompts_per_call):
        chunk = jobs[start:start + prompts_per_call]
        prompts = [{**row, policy.prompt_column: bench.prompt(row, options)} for row, _ in chunk]
        seeds = [sample_seed(seed, row["id"], k) for row, k in chunk]
        rollout = policy.rollout(prompts, 1, seeds, greedy=greedy)
        if rollout.auxiliary is not None:  # rows drawn only for a reward's comparison
            rollout = rollout.select((~rollout.auxiliary).nonzero().flatten())
        if len(rollout) != len(chunk):
            raise RuntimeError(f"{type(policy).__name__}.rollout gave {len(rollout)} rows for {len(chunk)} prompts "
                               "of one sample each")
        new = [{"id": row["id"], "k": k, "seed": s, "prompt": prompts[j][policy.prompt_column],
                "completion": rollout.completions[j], "columns": {c: v[j] for c, v in rollout.columns.items()}}
               for j, ((row, k), s) in enumerate(zip(chunk, seeds))]
        out += new
        if on_call is not None:
            on_call(new)
    return out


def _scorer_columns(bench: Benchmark) -> set[str] | None:
    """The columns the scorer names (None: it takes every column, **kwargs)."""
    params = inspect.signature(get_reward(bench.scorer)).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params} - {"prompts", "completions", "log_metric"}


def score_samples(bench: Benchmark, metric_fns: Mapping[str, RewardFn], samples: Sequence[dict],
                  rows: Mapping[str, Row]) -> list[dict]:
    """Each sample scored on every metric: ``{"id", "k", "categories", "values": {metric: float | None}}``.
    The scorer sees the sample's prompt and completion and, of its row's columns (with the options the
    harness adds to them) and the policy's own, those it names (every one if it takes ``**columns``)."""
    if not samples:
        return []
    taken = _scorer_columns(bench)
    merged = [{**rows[s["id"]], **s["columns"]} for s in samples]
    bound = {arg for args in bench.metrics.values() for arg in args}  # the metrics' own arguments
    present = {k for m in merged for k in m} - bound
    columns = {name: [m.get(name) for m in merged] for name in sorted(present if taken is None else present & taken)}
    values = compute_rewards(metric_fns, [s["prompt"] for s in samples], [s["completion"] for s in samples], columns)
    out = []
    for i, s in enumerate(samples):
        row = rows[s["id"]]
        out.append({"id": s["id"], "k": s["k"], "categories": {c: row.get(c) for c in bench.categories},
                    "values": {m: None if math.isnan(float(v[i])) else float(v[i]) for m, v in values.items()}})
    return out


class PeriodicBench:
    """``eval.bench``: a benchmark's subset, its rows read and checked before the model loads, scored at
    every evaluation with the run's own policy settings (the protocol's generation settings apply in
    `mmrl bench`); `scores` gives ``bench/NAME/FIGURE`` and ``bench/NAME/FIGURE_se``."""

    def __init__(self, cfg: BenchEvalConfig):
        self.bench: Benchmark = BENCHMARKS.get(cfg.name)
        try:
            self.options = self.bench.with_options(cfg.options)
        except ValueError as e:
            raise ValueError(f"eval.bench.options: {e}") from None
        self.rows, _ = benchmark_rows(self.bench, self.options, cfg.data, cfg.split, cfg.num_prompts)
        self.metric_fns = bench_metric_fns(self.bench, cfg.scorer_url)

    def scores(self, policy: Policy, seed: int) -> dict[str, float]:
        bench = self.bench
        options = bench.resolve_options(self.options, policy) if bench.resolve_options else self.options
        samples = generate_samples(policy, bench, self.rows, options, seed, bench.samples, bench.greedy)
        scored = score_samples(bench, self.metric_fns, samples, {r["id"]: {**r, **options} for r in self.rows})
        out = {}
        for name, figure in bench_figures(bench, scored)["figures"].items():
            out[f"bench/{bench.name}/{name}"], out[f"bench/{bench.name}/{name}_se"] = figure["value"], figure["se"]
        return out
