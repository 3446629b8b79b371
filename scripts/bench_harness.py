"""Shared by the trainer benchmarks (bench_engine, bench_vlm): each contender runs in a process of
its own, its steps alternating with bare steps on a second copy of the model, and its time is
taken relative to the bare steps beside it (process-to-process variation here is ~10%, larger
than the differences measured); peak RSS comes from a contender alone in a fresh process."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any, Callable


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class PhaseTimer:
    """Wall time spent in chosen methods, summed per phase until `take()`; a phase entered
    while another is running counts towards the outer one."""

    def __init__(self):
        self.total: dict[str, float] = defaultdict(float)
        self.active = False

    def wrap(self, obj: Any, method: str, phase: str) -> None:
        inner = getattr(obj, method)

        def timed(*args, **kwargs):
            if self.active:
                return inner(*args, **kwargs)
            self.active, t0 = True, time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.total[phase] += time.perf_counter() - t0
                self.active = False

        setattr(obj, method, timed)

    def take(self) -> dict[str, float]:
        out = dict(self.total)
        self.total.clear()
        return out


def timed_steps(step: Callable[[], Any], warmup: int, steps: int,
                bare: Callable[[], float] | None) -> tuple[list[float], list[float], list[Any]]:
    """Run `warmup + steps` steps; for each timed one its wall time, the time of a bare step run
    right after it (when `bare` is given), and what `step` returned."""
    times, floor, results = [], [], []
    for k in range(warmup + steps):
        t0 = time.perf_counter()
        result = step()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
            results.append(result)
            if bare is not None:
                floor.append(bare())
    return times, floor, results


def trl_step_timer(warmup: int, times: list[float], floor: list[float], bare: Callable[[], float] | None,
                   phases: PhaseTimer | None = None, split: list[dict] | None = None):
    """A TRL `TrainerCallback` that appends the wall time from one step's end to the next
    (generation, scoring and update included, the interleaved bare step left out) to `times`,
    the bare step's time to `floor`, and the step's phases to `split`."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        last = None

        def on_step_end(self, a, state, control, **kw):
            now = time.perf_counter()
            step_phases = phases.take() if phases is not None else {}
            if state.global_step > warmup and self.last is not None:
                times.append(now - self.last)
                if split is not None:
                    split.append(step_phases)
                if bare is not None:
                    floor.append(bare())
            self.last = time.perf_counter()

    return StepTimer()


def launch(script: str, name: str, options: dict[str, Any], interleave: bool, threads: int) -> dict:
    """`python script --worker NAME --key=value ...` in a fresh process; its last stdout line, as JSON."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, script, "--worker", name] + [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    if interleave:
        cmd.append("--interleave")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(script: str, options: dict[str, Any], threads: int, rounds: int, timed: tuple[str, ...],
            alone: tuple[str, ...]) -> tuple[dict[str, float], dict[str, list], dict[str, list], dict[str, list]]:
    """Peak RSS of each of `alone` in a fresh process; then `rounds` rounds in which each of `timed`
    runs interleaved with bare steps. Returns (peak RSS, step times, bare times beside them, the
    workers' per-step extras) per contender."""
    rss = {name: launch(script, name, options, interleave=False, threads=threads)["peak_rss_mb"] for name in alone}
    per_step: dict[str, list] = {name: [] for name in timed}
    floor: dict[str, list] = {name: [] for name in timed}
    extra: dict[str, list] = {name: [] for name in timed}
    for _ in range(rounds):
        for name in timed:
            row = launch(script, name, options, interleave=True, threads=threads)
            per_step[name] += row["times"]
            floor[name] += row["floor"]
            extra[name] += row.get("extra", [])
    return rss, per_step, floor, extra


def over_bare(times: list[float], floor: list[float]) -> float:
    """Median step time over the median bare step beside it."""
    return statistics.median(times) / statistics.median(floor)
