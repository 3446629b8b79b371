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

import hashlib
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mmrl.config.parse import ConfigError, load_recipe, to_dict
from mmrl.config.recipes import resolve_recipe
from mmrl.errors import UserError
from mmrl.registry import DEMOS, RECIPES, load_plugins
from mmrl.experiments.demo import run_scored
from mmrl.train.loop.plan import validate
from mmrl.experiments.sweep_report import read_summary, write_reports

WARM_DIR = "warm_starts"


# the parts of a config the supervised warm start reads
WARM_START_KEYS = ("task", "policy", "data", "warm_start", "reward_modules", "seed", "optim.lora")


@dataclass(frozen=True)
class Run:
    cell: int
    overrides: tuple[str, ...]  # the cell's key=value settings
    seed: int

    @property
    def dirname(self) -> str:
        slug = re.sub(r"[^A-Za-z0-9.=_-]+", "_", "_".join(o.split(".")[-1] for o in self.overrides))[:80]
        digest = hashlib.sha256("\n".join(self.overrides).encode()).hexdigest()[:8]
        return f"{slug or 'base'}-{digest}/seed-{self.seed}"


# ----- the plan --------------------------------------------------------------------------------
def split_values(text: str) -> list[str]:
    """V1,V2,... split at the commas outside brackets (a value may be a YAML list or mapping)."""
    values, depth, current = [], 0, ""
    for ch in text:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            values.append(current)
            current = ""
        else:
            current += ch
    values.append(current)
    return values


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    grid, seen = [], set()
    for item in items:
        key, sep, raw = item.partition("=")
        values = split_values(raw)
        if not sep or not key or any(v == "" for v in values):
            raise UserError(f"--grid {item!r} is not of the form KEY=V1,V2,...")
        if key in seen:
            raise UserError(f"--grid names {key!r} twice")
        seen.add(key)
        grid.append((key, values))
    return grid


def parse_cells(items: list[str]) -> list[tuple[str, ...]]:
    """`--cell "k=v k2=v2"`: one cell's settings (methods that differ in several keys)."""
    out = []
    for item in items:
        overrides = tuple(shlex.split(item))
        if not overrides or any("=" not in o or o.startswith("=") for o in overrides):
            raise UserError(f"--cell {item!r} is not a space-separated list of key=value")
        out.append(overrides)
    return out


def cells(grid: list[tuple[str, list[str]]], bundles: list[tuple[str, ...]] = ()) -> list[tuple[str, ...]]:
    """The product of the `--cell` list (one axis) and the `--grid` axes."""
    axes = ([list(bundles)] if bundles else []) + [[(f"{k}={v}",) for v in values] for k, values in grid]
    return [sum(combo, ()) for combo in itertools.product(*axes)]


def parse_shard(text: str | None) -> tuple[int, int]:
    if text is None:
        return 0, 1
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise UserError(f"--shard {text!r} must be i/n with 0 <= i < n")
    return int(m.group(1)), int(m.group(2))


def plan(grid_cells: list[tuple[str, ...]], seeds: int) -> list[Run]:
    """Cell-major, so that parallel runs start on different seeds' warm starts."""
    return [Run(c, overrides, s) for c, overrides in enumerate(grid_cells) for s in range(seeds)]


def recipe_of(target: str):
    load_plugins()
    if target in DEMOS.names():
        return RECIPES.get(DEMOS.get(target))
    return resolve_recipe(target)


def run_overrides(common: list[str], run: Run, run_dir: Path) -> list[str]:
    # a run without a complete summary starts again from scratch (overwrite: a killed run's files go)
    return [*common, *run.overrides, f"seed={run.seed}", f"output_dir={run_dir}", "overwrite=true"]


# ----- the cached warm start (inside a run's process) -------------------------------------------
def warm_key(cfg, ignores: list[str]) -> str:
    full = to_dict(cfg)
    picked: dict = {}
    for key in WARM_START_KEYS:
        node, parts = full, key.split(".")
        for part in parts:
            node = node[part]
        picked[key] = node
    for key in ignores:
        head, *rest = key.split(".")
        node = picked.get(head)
        for part in rest[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if rest and isinstance(node, dict):
            node.pop(rest[-1], None)
        elif not rest:
            picked.pop(head, None)
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_warm_start(cache: Path, ignores: list[str]) -> Callable:
    """A `warm_start(trainer)` that computes the warm start once per key and loads it afterwards."""
    import fcntl

    import torch

    def warm_start(trainer) -> None:
        cfg = trainer.cfg
        record = {"key": None, "reused": False}
        if cfg.warm_start.steps > 0:
            key = warm_key(cfg, ignores)
            path = cache / f"{key}.pt"
            cache.mkdir(parents=True, exist_ok=True)
            with open(cache / f"{key}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one process computes, the others wait and load
                if path.is_file():
                    state = torch.load(path, map_location="cpu", weights_only=True)
                    trainer.unwrapped.load_state_dict(state["model"])
                    trainer.reference_from_policy()
                    torch.set_rng_state(state["rng"])
                    record = {"key": key, "reused": True}
                else:
                    t0 = time.perf_counter()
                    loss = trainer.warm_start()
                    tmp = path.with_suffix(".tmp")
                    torch.save({"model": trainer.unwrapped.state_dict(), "rng": torch.get_rng_state()}, tmp)
                    os.replace(tmp, path)
                    record = {"key": key, "reused": False}
                    with open(cache / "log.jsonl", "a") as log:
                        log.write(json.dumps({"key": key, "seed": cfg.seed, "run": cfg.output_dir, "loss": loss,
                                              "wall_s": time.perf_counter() - t0}) + "\n")
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "warm_start.json").write_text(json.dumps(record))

    return warm_start


def run_one(target: str, overrides: list[str], cache: Path, ignores: list[str]) -> None:
    run_scored(recipe_of(target), overrides, target, cached_warm_start(cache, ignores))


# ----- the sweep --------------------------------------------------------------------------------
def sweep(target: str, grid_items: list[str], seeds: int, out: Path, common: list[str] = (),
          parallel: int = 1, shard: str | None = None, ignores: list[str] = (),
          say: Callable[[str], None] = print, cell_items: list[str] = (), held_out_reward: str | None = None) -> int:
    """Run the sweep's missing runs (this shard's), then write the reports; 1 if a run failed.
    `held_out_reward` names the reward component the reports compare the cells on (None: the
    combined reward); every cell must declare it, at any weight."""
    if seeds < 1 or parallel < 1:
        raise UserError(f"--seeds {seeds} and --parallel {parallel} must be >= 1")
    if not grid_items and not cell_items:
        raise UserError("mmrl sweep needs at least one --grid KEY=V1,V2 or --cell \"k=v ...\"")
    grid, bundles = parse_grid(list(grid_items)), parse_cells(list(cell_items))
    shard_i, shard_n = parse_shard(shard)
    recipe, common = recipe_of(target), list(common)
    runs = plan(cells(grid, bundles), seeds)
    for item in (*common, *(o for run in runs for o in run.overrides)):
        if item.partition("=")[0].strip() == "output_dir":  # run_overrides sets each run's own
            raise UserError(f"mmrl sweep: {item!r} would be ignored: each run writes under --out DIR "
                            f"(DIR/runs/<cell>/seed-<n>); give --out instead of output_dir")
    for run in (r for r in runs if r.seed == 0):  # every cell's config is valid before anything runs
        try:
            cfg = load_recipe(recipe, run_overrides(common, run, out / "runs" / run.dirname))
            validate(cfg)
        except ConfigError as e:
            raise ConfigError(f"mmrl sweep: cell {' '.join(run.overrides)}: {e}") from None
        if held_out_reward is not None and held_out_reward not in cfg.rewards:
            raise UserError(f"mmrl sweep --held-out-reward {held_out_reward}: cell {' '.join(run.overrides)} has no "
                            f"such reward; its rewards: {sorted(cfg.rewards)}")
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
