"""The reports of a sweep, rewritten from every complete run: ``sweep.csv`` (one row per run), ``sweep.md``
(mean and standard error over seeds per cell, the difference to the first cell paired by seed),
``sweep_evals.csv`` (every evaluation step of every run: the training reward, the held-out proxy
reward and the held-out evaluator, the gold judge that is never a reward) and ``sweep.png``
(held-out reward bars, each cell's training reward curve and, where the runs have an evaluator and
`eval.every`, the proxy against the gold per cell: a line that goes right and down is a method that
keeps raising the reward while the judge falls)."""

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


def _write_csv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    """`rows` as a CSV file, written whole or not at all (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


EVAL_STEP_FIELDS = ("cell", "seed", "step", "train_reward", "proxy", "gold")


def _eval_steps(run_dir: Path) -> list[dict]:
    """The run's periodic evaluations (`eval.every`) that scored the evaluator: step, the step's
    training reward, the held-out proxy reward (`eval/reward_mean`), the gold (`eval/eval_mean`)."""
    points = []
    try:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            if "eval/eval_mean" in row and "step" in row:
                points.append({"step": int(row["step"]), "train_reward": row.get("reward_mean", math.nan),
                               "proxy": float(row["eval/reward_mean"]), "gold": float(row["eval/eval_mean"])})
    except (OSError, ValueError):
        pass
    return points


def _write_eval_steps(out: Path, runs: list[Run], rows: list[dict]) -> dict[int, list[tuple[int, float, float]]]:
    """``sweep_evals.csv``; per cell, the (step, proxy, gold) means over the seeds that finished."""
    finished = {(r["cell"], r["seed"]) for r in rows}
    records, by_cell = [], {}
    for run in runs:
        if (run.cell, run.seed) in finished:
            for point in _eval_steps(out / "runs" / run.dirname):
                records.append({"cell": run.cell, "seed": run.seed, **point})
                by_cell.setdefault(run.cell, {}).setdefault(point["step"], []).append((point["proxy"], point["gold"]))
    _write_csv(out / "sweep_evals.csv", EVAL_STEP_FIELDS, records)
    return {c: [(step, sum(p for p, _ in v) / len(v), sum(g for _, g in v) / len(v)) for step, v in sorted(steps.items())]
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
    _write_csv(out / "sweep.csv", CSV_FIELDS, rows)
    cell_overrides = {run.cell: run.overrides for run in runs}
    curves = _write_eval_steps(out, runs, rows)
    (out / "sweep.md").write_text(_markdown(rows, cell_overrides) + "\n".join(_proxy_gold_lines(curves, cell_overrides))
                                  + ("\n" if curves else ""))
    _figure(out, rows, cell_overrides, runs, curves)
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


def _figure(out: Path, rows: list[dict], cell_overrides: dict[int, tuple[str, ...]], runs: list[Run],
            proxy_gold: dict[int, list[tuple[int, float, float]]]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    panels = 3 if proxy_gold else 2
    fig = Figure(figsize=(6 * panels, 4.5 + 0.2 * len(cell_overrides)))
    FigureCanvasAgg(fig)
    bars, curves = fig.add_subplot(1, panels, 1), fig.add_subplot(1, panels, 2)
    if proxy_gold:
        _proxy_gold_panel(fig.add_subplot(1, panels, 3), proxy_gold)
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


def _proxy_gold_panel(ax, proxy_gold: dict[int, list[tuple[int, float, float]]]) -> None:
    """Per cell, the evaluations in step order: proxy on x, gold on y, the last one marked."""
    for c, points in proxy_gold.items():
        xs, ys = [p for _, p, _ in points], [g for _, _, g in points]
        ax.plot(xs, ys, "-o", color=f"C{c % 10}", markersize=3)
        ax.annotate(str(c), (xs[-1], ys[-1]), color=f"C{c % 10}", fontsize=8, xytext=(3, 3), textcoords="offset points")
        ax.plot(xs[-1:], ys[-1:], "s", color=f"C{c % 10}", markersize=7)
    ax.set_xlabel("proxy: held-out reward (mean over seeds)")
    ax.set_ylabel("gold: held-out evaluator (mean over seeds)")
    ax.set_title("proxy against gold per evaluation (square: the last)", fontsize=9)
