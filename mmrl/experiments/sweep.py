"""``mmrl sweep RECIPE_OR_DEMO --grid KEY=V1,V2 [--grid ...] [--cell "k=v ..."] --seeds N [key=value ...]``.

Every cell of the grid (the product of the `--grid` axes and, as one more axis, the `--cell`
list, each cell a set of settings) runs for seeds 0 .. N-1, each run a
separate process (``python -m mmrl.cli.sweep_worker --run ...``: warm start, held-out score, RL, held-out
score, ``summary.json``, as `mmrl demo` does), so a crash or a kill loses one run. Up to
`--parallel` runs at a time; `--shard i/n` runs only every n-th run from the i-th (0 <= i < n),
for spreading one sweep over machines that share the output directory. A run whose
``summary.json`` is complete is skipped, so a killed sweep resumes where it stopped.

Warm starts are cached in ``OUT/warm_starts/KEY.pt`` (weights and the torch RNG state after the
warm start), KEY a hash of what the warm start reads: task, policy, data, warm_start,
optim.lora, reward_modules and seed, less the `--warm-start-ignores` keys (e.g.
``policy.sampler`` when a grid varies only the RL sampler). The first run of a key computes it
under a file lock; every other run of that key loads it. ``warm_starts/log.jsonl`` records each
computation, each run's ``warm_start.json`` whether it reused one.

Reports, rewritten from every complete run at the end of each invocation: ``sweep.csv`` (one
row per run), ``sweep.md`` (mean and standard error over seeds per cell, the difference to the
first cell paired by seed) and ``sweep.png`` (held-out reward bars with standard-error bars, and
each cell's training reward curve, mean over seeds, overlaid). See docs/sweep.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from mmrl.config.parse import ConfigError, load_recipe, to_dict
from mmrl.config.recipes import resolve_recipe
from mmrl.data import DataError
from mmrl.errors import UserError, reading_user_input
from mmrl.experiments.demo import run_scored
from mmrl.experiments.sweep_grid import Run, cells, parse_cells, parse_grid, parse_shard, plan
from mmrl.experiments.sweep_report import write_reports
from mmrl.experiments.sweep_runs import read_summary
from mmrl.experiments.warm_start_cache import WARM_DIR, cached_warm_start
from mmrl.registry import DEMOS, RECIPES, load_plugins
from mmrl.train.loop.parts import stage_inputs
from mmrl.train.plan.validate import validate

DATA_KEYS = ("task", "policy", "data", "rewards", "reward_modules", "warm_start")  # what a cell's data checks read


def recipe_of(target: str):
    load_plugins()
    if target in DEMOS.names():
        return RECIPES.get(DEMOS.get(target))
    return resolve_recipe(target)


def run_overrides(common: list[str], run: Run, run_dir: Path) -> list[str]:
    # a run without a complete summary starts again from scratch (overwrite: a killed run's files go)
    return [*common, *run.overrides, f"seed={run.seed}", f"output_dir={run_dir}", "overwrite=true"]


def run_one(target: str, overrides: list[str], cache: Path, ignores: list[str]) -> None:
    run_scored(recipe_of(target), overrides, target, cached_warm_start(cache, ignores))


# ----- the sweep --------------------------------------------------------------------------------
def checked_runs(target: str, grid_items: list[str], seeds: int, out: Path, common: list[str] = (),
                 cell_items: list[str] = (), held_out_reward: str | None = None) -> list[Run]:
    """The sweep's runs, every cell's config validated before anything runs (as `mmrl train` checks
    a recipe); loads nothing."""
    if seeds < 1:
        raise UserError(f"--seeds {seeds} must be >= 1")
    if not grid_items and not cell_items:
        raise UserError("mmrl sweep needs at least one --grid KEY=V1,V2 or --cell \"k=v ...\"")
    recipe, common = recipe_of(target), list(common)
    runs = plan(cells(parse_grid(list(grid_items)), parse_cells(list(cell_items))), seeds)
    for item in (*common, *(o for run in runs for o in run.overrides)):
        if item.partition("=")[0].strip() == "output_dir":  # run_overrides sets each run's own
            raise UserError(f"mmrl sweep: {item!r} would be ignored: each run writes under --out DIR "
                            f"(DIR/runs/<cell>/seed-<n>); give --out instead of output_dir")
    check_cells(recipe, common, [r for r in runs if r.seed == 0], out, held_out_reward)
    return runs


def sweep(target: str, grid_items: list[str], seeds: int, out: Path, common: list[str] = (),
          parallel: int = 1, shard: str | None = None, ignores: list[str] = (),
          say: Callable[[str], None] = print, cell_items: list[str] = (), held_out_reward: str | None = None) -> int:
    """Run the sweep's missing runs (this shard's), then write the reports; 1 if a run failed.
    `held_out_reward` names the reward component the reports compare the cells on (None: the
    combined reward); every cell must declare it, at any weight."""
    if parallel < 1:
        raise UserError(f"--parallel {parallel} must be >= 1")
    shard_i, shard_n = parse_shard(shard)
    runs = checked_runs(target, grid_items, seeds, out, common, cell_items, held_out_reward)
    grid, bundles, common = parse_grid(list(grid_items)), parse_cells(list(cell_items)), list(common)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps({"target": target, "cells": bundles, "grid": grid, "seeds": seeds,
                                                "overrides": common, "held_out_reward": held_out_reward}, indent=1))
    todo = [r for i, r in enumerate(runs) if i % shard_n == shard_i and read_summary(out / "runs" / r.dirname) is None]
    say(f"[mmrl sweep] {len(runs)} runs ({len(runs) // seeds} cells x {seeds} seeds); "
        f"{len(todo)} to run in this invocation, {parallel} at a time")
    failed = _execute(target, todo, out, common, parallel, list(ignores), say)
    write_reports(out, runs, held_out_reward)
    say(f"[mmrl sweep] wrote {out / 'sweep.csv'}, {out / 'sweep.md'}, {out / 'sweep.png'}")
    return 1 if failed else 0


@reading_user_input()  # a data file that cannot be read is the user's to fix
def check_cells(recipe, common: list[str], runs: list[Run], out: Path, held_out_reward: str | None) -> None:
    """Before any run starts: every cell's recipe is valid, names `held_out_reward`, and its data
    (read and validated once per distinct data, rewards and policy) has the held-out rows that
    every run scores before and after RL."""
    read: set[str] = set()
    for run in runs:
        cell = " ".join(run.overrides)
        try:
            cfg = load_recipe(recipe, run_overrides(common, run, out / "runs" / run.dirname))
            plan = validate(cfg)
        except ConfigError as e:
            raise ConfigError(f"mmrl sweep: cell {cell}: {e}") from None
        if held_out_reward is not None and held_out_reward not in cfg.rewards:
            raise UserError(f"mmrl sweep --held-out-reward {held_out_reward}: cell {cell} has no such reward; its "
                            f"rewards: {sorted(cfg.rewards)}")
        key = json.dumps([to_dict(cfg)[k] for k in DATA_KEYS], sort_keys=True, default=str)
        if key in read:
            continue
        read.add(key)
        try:
            stage_inputs(plan.stage_at(0), plan, warm_start=True, held_out=True)
        except (UserError, DataError) as e:
            raise type(e)(f"mmrl sweep: cell {cell}: {e}") from None


def run_environment(parallel: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of each run: the machine's cores shared out between the `parallel` runs
    (OMP / MKL threads = cores // parallel, at least 1), unless the user set OMP_NUM_THREADS.
    PyTorch's default of one thread per core in every run oversubscribes the cores, and its
    spinning threads then make each run several times slower."""
    env = dict(os.environ if environ is None else environ)
    if "OMP_NUM_THREADS" not in env:
        threads = str(max(1, (os.cpu_count() or 1) // parallel))
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    return env


def _execute(target: str, todo: list[Run], out: Path, common: list[str], parallel: int,
             ignores: list[str], say) -> list[Run]:
    pending, active, failed = list(todo), [], []
    env = run_environment(parallel)
    while pending or active:
        while pending and len(active) < parallel:
            run = pending.pop(0)
            run_dir = out / "runs" / run.dirname
            run_dir.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "mmrl.cli.sweep_worker", "--run", target, "--warm-cache", str(out / WARM_DIR),
                   *[f"--warm-start-ignores={k}" for k in ignores], "--", *run_overrides(common, run, run_dir)]
            log = open(run_dir / "log.txt", "w")  # noqa: SIM115 (open while the run lives, closed below)
            active.append((run, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
            say(f"[mmrl sweep] start {run.dirname} {' '.join(run.overrides)}")
        time.sleep(0.2)
        for item in list(active):
            run, proc, log = item
            if proc.poll() is None:
                continue
            active.remove(item)
            log.close()
            ok = proc.returncode == 0 and read_summary(out / "runs" / run.dirname) is not None
            say(f"[mmrl sweep] {'done' if ok else f'FAILED (exit {proc.returncode})'} {run.dirname}")
            if not ok:
                failed.append(run)
    for run in failed:
        say(f"[mmrl sweep] failed: {run.dirname} (see {out / 'runs' / run.dirname / 'log.txt'})")
    return failed
