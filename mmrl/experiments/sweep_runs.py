"""What a sweep reads of each run: its summary (the held-out reward before and after, or one component
of it), its training reward per step, its periodic evaluations; and the mean ± standard error over
seeds that every report uses."""

from __future__ import annotations

import json
import math
from pathlib import Path

from mmrl.errors import UserError

SUMMARY = "summary.json"

EVAL_FIELDS = ("eval_before", "eval_after", "greedy_eval_before", "greedy_eval_after")  # NaN without an evaluator


def held_out(summary: dict, component: str | None, run_dir: Path) -> dict[str, float]:
    """The run's held-out reward before and after, sampled and greedy: the combined reward, or the
    named component from the summary's evaluation details."""
    if component is None:
        return {k: summary[k] for k in ("before", "after", "greedy_before", "greedy_after")}
    values = {}
    for when in ("before", "after"):
        detail = summary.get(f"{when}_detail", {})
        for prefix, key in (("reward/", when), ("greedy/", f"greedy_{when}")):
            if prefix + component not in detail:
                known = sorted(k.partition("/")[2] for k in detail if k.startswith("reward/"))
                raise UserError(f"mmrl sweep --held-out-reward {component}: {run_dir / SUMMARY} has no "
                                f"{when}_detail[{prefix + component!r}]; its reward components: {known}")
            value = detail[prefix + component]
            values[key] = math.nan if value is None else float(value)
    return values


def read_summary(run_dir: Path) -> dict | None:
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return summary if "after" in summary else None


def mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    mean = sum(xs) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1) / n)


def fmt_mean_se(mean: float, se: float) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.3f}" if math.isnan(se) else f"{mean:.3f} ± {se:.3f}"


def training_curve(run_dir: Path, component: str | None) -> list[tuple[int, float]]:
    """The run's training reward per RL step: `reward_mean`, or the component `reward/COMPONENT`."""
    key = "reward_mean" if component is None else f"reward/{component}"
    points = []
    try:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            if row.get(key) is not None and "step" in row:
                points.append((int(row["step"]), float(row[key])))
    except (OSError, ValueError):
        pass
    return points


def eval_steps(run_dir: Path, component: str | None) -> list[dict]:
    """The run's periodic evaluations (`eval.every`) that scored the evaluator: step, the training
    time up to it (the steps' `time_step_s` summed, evaluations left out: what runs in different
    rollout modes are compared at), the step's training reward, the held-out proxy reward
    (`eval/reward_mean`, or `eval/reward/COMPONENT`), the gold (`eval/eval_mean`)."""
    proxy_key = "eval/reward_mean" if component is None else f"eval/reward/{component}"
    points, train_s = [], 0.0
    try:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            train_s += row.get("time_step_s") or 0.0
            if "eval/eval_mean" in row and "step" in row:
                points.append({"step": int(row["step"]), "train_s": round(train_s, 3),
                               "train_reward": row.get("reward_mean", math.nan),
                               "proxy": float(row[proxy_key]), "gold": float(row["eval/eval_mean"])})
    except (OSError, ValueError):
        pass
    except KeyError:
        raise UserError(f"mmrl sweep --held-out-reward {component}: {run_dir / 'metrics.jsonl'} has evaluations "
                        f"without {proxy_key!r}") from None
    return points
