"""The reports of a sweep, rewritten from every complete run: ``sweep.csv`` (one row per run), ``sweep.md``
(mean and standard error over seeds per cell, the difference to the first cell paired by seed) and
``sweep.png`` (held-out reward bars and each cell's training reward curve)."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mmrl.train.sweep import Run

SUMMARY = "summary.json"

EVAL_FIELDS = ("eval_before", "eval_after", "greedy_eval_before", "greedy_eval_after")  # NaN without an evaluator


def read_summary(run_dir: Path) -> dict | None:
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return summary if "after" in summary else None


CSV_FIELDS = ("cell", "overrides", "seed", "before", "after", "greedy_before", "greedy_after", "eval_before",
              "eval_after", "greedy_eval_before", "greedy_eval_after", "wall_s", "run_dir")


# ----- reports ----------------------------------------------------------------------------------
def _mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    mean = sum(xs) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1) / n)


def _fmt(mean: float, se: float) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.3f}" if math.isnan(se) else f"{mean:.3f} ± {se:.3f}"


def _curve(run_dir: Path) -> list[tuple[int, float]]:
    points = []
    try:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            if "reward_mean" in row and "step" in row:
                points.append((int(row["step"]), float(row["reward_mean"])))
    except (OSError, ValueError):
        pass
    return points


def write_reports(out: Path, runs: list[Run]) -> list[dict]:
    rows = []
    for run in runs:
        summary = read_summary(out / "runs" / run.dirname)
        if summary is None:
            continue
        rows.append({"cell": run.cell, "overrides": " ".join(run.overrides), "seed": run.seed,
                     "before": summary["before"], "after": summary["after"],
                     "greedy_before": summary["greedy_before"], "greedy_after": summary["greedy_after"],
                     **{k: summary.get(k, math.nan) for k in EVAL_FIELDS},
                     "wall_s": round(summary["wall_s"], 1), "run_dir": str(Path("runs") / run.dirname)})
    tmp = out / "sweep.csv.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, out / "sweep.csv")
    cell_overrides = {run.cell: run.overrides for run in runs}
    (out / "sweep.md").write_text(_markdown(rows, cell_overrides))
    _figure(out, rows, cell_overrides, runs)
    return rows


def _markdown(rows: list[dict], cell_overrides: dict[int, tuple[str, ...]]) -> str:
    by_cell = {c: [r for r in rows if r["cell"] == c] for c in cell_overrides}
    first = by_cell[0] if by_cell else []
    lines = ["| cell | runs | held-out before | held-out after | after - before | greedy after | after - cell 0 (paired by seed) "
             "| evaluator before | evaluator after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c, overrides in cell_overrides.items():
        rs = by_cell[c]
        gain = _mean_se([r["after"] - r["before"] for r in rs])
        base = {r["seed"]: r["after"] for r in first}
        diff = _mean_se([r["after"] - base[r["seed"]] for r in rs if r["seed"] in base])
        lines.append(f"| {c}: {' '.join(overrides) or '(base)'} | {len(rs)} | {_fmt(*_mean_se([r['before'] for r in rs]))} | "
                     f"{_fmt(*_mean_se([r['after'] for r in rs]))} | {_fmt(*gain)} | "
                     f"{_fmt(*_mean_se([r['greedy_after'] for r in rs]))} | {'-' if c == 0 else _fmt(*diff)} | "
                     f"{_fmt(*_mean_se([r['eval_before'] for r in rs]))} | {_fmt(*_mean_se([r['eval_after'] for r in rs]))} |")
    lines += ["", ("Mean ± standard error over seeds (sample std / sqrt(n)); held-out: the demo's metric "
                   "(mean reward of the eval samples per held-out prompt); after - cell 0 is the mean over the "
                   "seeds both cells finished of (after - cell 0's after), with its standard error; evaluator: the demo's "
                   "held-out evaluator (a second judge, never a reward) on the same samples, n/a without one.")]
    return "\n".join(lines) + "\n"


def _figure(out: Path, rows: list[dict], cell_overrides: dict[int, tuple[str, ...]], runs: list[Run]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(12, 4.5 + 0.2 * len(cell_overrides)))
    FigureCanvasAgg(fig)
    bars, curves = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    labels = [f"{c}: " + (" ".join(ov) or "(base)") for c, ov in cell_overrides.items()]
    for c, label in zip(cell_overrides, labels):
        rs = [r for r in rows if r["cell"] == c]
        for offset, key, alpha in ((-0.2, "before", 0.4), (0.2, "after", 1.0)):
            mean, se = _mean_se([r[key] for r in rs])
            bars.bar(c + offset, 0 if math.isnan(mean) else mean, width=0.4, alpha=alpha, color=f"C{c % 10}",
                     yerr=None if math.isnan(se) else se, capsize=3, label=key if c == 0 else None)
        steps: dict[int, list[float]] = {}
        for run in runs:
            if run.cell == c and any(r["cell"] == c and r["seed"] == run.seed for r in rs):
                for step, value in _curve(out / "runs" / run.dirname):
                    steps.setdefault(step, []).append(value)
        if steps:
            xs = sorted(steps)
            stats = [_mean_se(steps[x]) for x in xs]
            ys = [m for m, _ in stats]
            ses = [0.0 if math.isnan(s) else s for _, s in stats]
            curves.plot(xs, ys, color=f"C{c % 10}", label=label)
            curves.fill_between(xs, [y - s for y, s in zip(ys, ses)], [y + s for y, s in zip(ys, ses)],
                                color=f"C{c % 10}", alpha=0.2)
    bars.set_xticks(list(cell_overrides), [str(c) for c in cell_overrides])
    bars.set_xlabel("cell")
    bars.set_ylabel("held-out reward (mean ± SE over seeds)")
    bars.legend(fontsize=7)
    curves.set_xlabel("RL step")
    curves.set_ylabel("training reward_mean (mean ± SE over seeds)")
    # the cells' full settings under the plots, one line each (numbered as the bars and sweep.md)
    handles = curves.get_lines()
    fig.legend(handles, [h.get_label() for h in handles], loc="lower center", ncol=1, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.045 * len(cell_overrides) / (1 + 0.045 * len(cell_overrides)) + 0.02, 1, 1))
    fig.savefig(out / "sweep.png", dpi=110)
