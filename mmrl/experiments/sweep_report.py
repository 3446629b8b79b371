"""The reports of a sweep, rewritten from every complete run: ``sweep.csv`` (one row per run), ``sweep.md``
(mean and standard error over seeds per cell, the difference to the first cell paired by seed; the
proxy against the gold per evaluation; the cells at equal training time, for cells that train at
different speeds),
``sweep_evals.csv`` (every evaluation step of every run: the training reward, the held-out proxy
reward and the held-out evaluator, the gold judge that is never a reward) and ``sweep.png``
(held-out reward bars, each cell's training reward curve and, where the runs have an evaluator and
`eval.every`, the proxy against the gold per cell: a line that goes right and down is a method that
keeps raising the reward while the judge falls).

The held-out reward is the run's combined reward (`reward_mean`) unless the sweep names one reward
component (`--held-out-reward NAME`): then every cell is compared on that component, which cells
that train on another reward (a win rate, a zero-weighted term) still compute and log."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

from mmrl.experiments.sweep_equal_time import equal_time_lines
from mmrl.experiments.sweep_figure import write_figure
from mmrl.experiments.sweep_grid import Run
from mmrl.experiments.sweep_runs import EVAL_FIELDS, eval_steps, fmt_mean_se, held_out, mean_se, read_summary

CSV_FIELDS = ("cell", "overrides", "seed", "before", "after", "greedy_before", "greedy_after", "eval_before",
              "eval_after", "greedy_eval_before", "greedy_eval_after", "wall_s", "run_dir")


def _write_csv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    """`rows` as a CSV file, written whole or not at all (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


EVAL_STEP_FIELDS = ("cell", "seed", "step", "train_s", "train_reward", "proxy", "gold")


def _write_eval_steps(out: Path, runs: list[Run], rows: list[dict],
                      component: str | None) -> tuple[list[dict], dict[int, list[tuple[int, float, float]]]]:
    """``sweep_evals.csv``; its records, and per cell the (step, proxy, gold) means over the seeds that finished."""
    finished = {(r["cell"], r["seed"]) for r in rows}
    records, by_cell = [], {}
    for run in runs:
        if (run.cell, run.seed) in finished:
            for point in eval_steps(out / "runs" / run.dirname, component):
                records.append({"cell": run.cell, "seed": run.seed, **point})
                by_cell.setdefault(run.cell, {}).setdefault(point["step"], []).append((point["proxy"], point["gold"]))
    _write_csv(out / "sweep_evals.csv", EVAL_STEP_FIELDS, records)
    return records, {c: [(step, sum(p for p, _ in v) / len(v), sum(g for _, g in v) / len(v)) for step, v in sorted(steps.items())]
            for c, steps in by_cell.items()}


def _proxy_gold_lines(curves: dict[int, list[tuple[int, float, float]]], cell_overrides) -> list[str]:
    """sweep.md's proxy-vs-gold table: per cell, the first and last evaluation, the gold's best and
    what the proxy and the gold did after it."""
    if not curves:
        return []
    lines = ["", "Proxy (held-out reward) and gold (held-out evaluator) at the evaluation steps, mean over seeds:", "",
             "| cell | proxy first -> last | gold first -> last | gold's best (step) | after gold's best: proxy, gold |",
             "|---|---|---|---|---|"]
    for c in cell_overrides:
        points = curves.get(c)
        if not points:
            continue
        best = max(range(len(points)), key=lambda i: points[i][2])
        step, proxy, gold = points[best]
        last = points[-1]
        lines.append(f"| {c} | {points[0][1]:.3f} -> {last[1]:.3f} | {points[0][2]:.3f} -> {last[2]:.3f} | "
                     f"{gold:.3f} ({step}) | {last[1] - proxy:+.3f}, {last[2] - gold:+.3f} |")
    lines += ["", "A cell whose proxy still rises after the gold's best while the gold falls is hacking the reward."]
    return lines


def write_reports(out: Path, runs: list[Run], held_out_reward: str | None = None) -> list[dict]:
    """Every report from the complete runs; `held_out_reward` names the reward component the
    held-out columns and the proxy report (None: the combined reward)."""
    rows = []
    for run in runs:
        summary = read_summary(out / "runs" / run.dirname)
        if summary is None:
            continue
        rows.append({"cell": run.cell, "overrides": " ".join(run.overrides), "seed": run.seed,
                     **held_out(summary, held_out_reward, out / "runs" / run.dirname),
                     **{k: summary.get(k, math.nan) for k in EVAL_FIELDS},
                     "wall_s": round(summary["wall_s"], 1), "run_dir": str(Path("runs") / run.dirname)})
    _write_csv(out / "sweep.csv", CSV_FIELDS, rows)
    cell_overrides = {run.cell: run.overrides for run in runs}
    records, curves = _write_eval_steps(out, runs, rows, held_out_reward)
    (out / "sweep.md").write_text(_markdown(rows, cell_overrides, held_out_reward)
                                  + "\n".join(_proxy_gold_lines(curves, cell_overrides) + equal_time_lines(records, list(cell_overrides)))
                                  + ("\n" if curves else ""))
    write_figure(out, rows, cell_overrides, runs, curves, held_out_reward)
    return rows


def _markdown(rows: list[dict], cell_overrides: dict[int, tuple[str, ...]], held_out_reward: str | None) -> str:
    by_cell = {c: [r for r in rows if r["cell"] == c] for c in cell_overrides}
    first = by_cell[0] if by_cell else []
    lines = ["| cell | runs | held-out before | held-out after | after - before | greedy after | after - cell 0 (paired by seed) "
             "| evaluator before | evaluator after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c, overrides in cell_overrides.items():
        rs = by_cell[c]
        gain = mean_se([r["after"] - r["before"] for r in rs])
        base = {r["seed"]: r["after"] for r in first}
        diff = mean_se([r["after"] - base[r["seed"]] for r in rs if r["seed"] in base])
        lines.append(f"| {c}: {' '.join(overrides) or '(base)'} | {len(rs)} | {fmt_mean_se(*mean_se([r['before'] for r in rs]))} | "
                     f"{fmt_mean_se(*mean_se([r['after'] for r in rs]))} | {fmt_mean_se(*gain)} | "
                     f"{fmt_mean_se(*mean_se([r['greedy_after'] for r in rs]))} | {'-' if c == 0 else fmt_mean_se(*diff)} | "
                     f"{fmt_mean_se(*mean_se([r['eval_before'] for r in rs]))} | {fmt_mean_se(*mean_se([r['eval_after'] for r in rs]))} |")
    metric = ("the demo's metric (mean reward of the eval samples per held-out prompt)" if held_out_reward is None
              else f"the reward component `{held_out_reward}` of the eval samples (mean per held-out prompt)")
    lines += ["", ("Mean ± standard error over seeds (sample std / sqrt(n)); held-out: " + metric + "; after - cell 0 "
                   "is the mean over the seeds both cells finished of (after - cell 0's after), with its standard error; evaluator: the demo's "
                   "held-out evaluator (a second judge, never a reward) on the same samples, n/a without one.")]
    return "\n".join(lines) + "\n"


