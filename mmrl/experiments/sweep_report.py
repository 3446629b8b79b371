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
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from mmrl.errors import UserError

if TYPE_CHECKING:
    from mmrl.experiments.sweep import Run

SUMMARY = "summary.json"

EVAL_FIELDS = ("eval_before", "eval_after", "greedy_eval_before", "greedy_eval_after")  # NaN without an evaluator


def _held_out(summary: dict, component: str | None, run_dir: Path) -> dict[str, float]:
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


def _curve(run_dir: Path, component: str | None) -> list[tuple[int, float]]:
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


def _write_csv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    """`rows` as a CSV file, written whole or not at all (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


EVAL_STEP_FIELDS = ("cell", "seed", "step", "train_s", "train_reward", "proxy", "gold")


def _eval_steps(run_dir: Path, component: str | None) -> list[dict]:
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


def _write_eval_steps(out: Path, runs: list[Run], rows: list[dict],
                      component: str | None) -> tuple[list[dict], dict[int, list[tuple[int, float, float]]]]:
    """``sweep_evals.csv``; its records, and per cell the (step, proxy, gold) means over the seeds that finished."""
    finished = {(r["cell"], r["seed"]) for r in rows}
    records, by_cell = [], {}
    for run in runs:
        if (run.cell, run.seed) in finished:
            for point in _eval_steps(out / "runs" / run.dirname, component):
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


def _at_time(points: list[dict], t: float) -> dict[str, float] | None:
    """The step, proxy and gold at training time `t`, linear between the two evaluations around it
    (None before the first: nothing is extrapolated)."""
    for a, b in zip(points, points[1:]):
        if a["train_s"] <= t <= b["train_s"]:
            w = (t - a["train_s"]) / (b["train_s"] - a["train_s"]) if b["train_s"] > a["train_s"] else 1.0
            return {k: a[k] + w * (b[k] - a[k]) for k in ("step", "proxy", "gold")}
    last = points[-1]
    return {k: last[k] for k in ("step", "proxy", "gold")} if last["train_s"] == t else None


def equal_time(records: list[dict], cells: list) -> tuple[float, dict] | None:
    """Cells that train at different speeds (rollout modes, methods of different step costs)
    compared after the same seconds of training, T, the earliest any run's last evaluation came
    (`records`: `sweep_evals.csv`'s rows). Per cell of `cells` that has runs: the seconds per step
    (a run's last training time over its step, mean over seeds), the speed relative to the first
    cell, and at T the steps taken, the proxy and the gold, each interpolated per run between its
    evaluations, (mean, SE) over seeds. None with fewer than two cells whose runs logged step times."""
    by_run: dict[tuple, list[dict]] = {}
    for r in records:
        by_run.setdefault((r["cell"], r["seed"]), []).append(r)
    for points in by_run.values():
        points.sort(key=lambda r: r["train_s"])
    by_run = {run: points for run, points in by_run.items() if points[-1]["train_s"] > 0}  # runs that logged step times
    if len({cell for cell, _ in by_run}) < 2:
        return None
    t = min(points[-1]["train_s"] for points in by_run.values())
    pace = {c: _mean_se([p[-1]["train_s"] / p[-1]["step"] for (cell, _), p in by_run.items() if cell == c])[0]
            for c in cells}
    table = {}
    for c in cells:
        at = [v for (cell, _), p in by_run.items() if cell == c and (v := _at_time(p, t)) is not None]
        if at:
            table[c] = {"s_per_step": pace[c], "speed": pace[cells[0]] / pace[c], "runs": len(at),
                        **{k: _mean_se([v[k] for v in at]) for k in ("step", "proxy", "gold")}}
    return t, table


def equal_time_lines(records: list[dict], cells: list, first: str = "cell 0") -> list[str]:
    """sweep.md's table at equal training time (`equal_time`); `first` names the first cell."""
    compared = equal_time(records, cells)
    if compared is None:
        return []
    t, table = compared
    lines = ["", f"At equal training time, T = {t:.1f} s (the earliest last evaluation of any run; training time: the "
             "steps' `time_step_s` summed, evaluations left out), interpolated per run between its evaluations, "
             f"mean ± SE over seeds; speed: steps per second relative to {first} (compare only runs that ran alone "
             "on the same machine):", "",
             f"| cell | s per step | speed vs {first} | steps by T | proxy at T | gold at T |", "|---|---|---|---|---|---|"]
    for c, row in table.items():
        lines.append(f"| {c} | {row['s_per_step']:.3f} | {row['speed']:.2f}x | {row['step'][0]:.0f} | "
                     f"{_fmt(*row['proxy'])} | {_fmt(*row['gold'])} |")
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
                     **_held_out(summary, held_out_reward, out / "runs" / run.dirname),
                     **{k: summary.get(k, math.nan) for k in EVAL_FIELDS},
                     "wall_s": round(summary["wall_s"], 1), "run_dir": str(Path("runs") / run.dirname)})
    _write_csv(out / "sweep.csv", CSV_FIELDS, rows)
    cell_overrides = {run.cell: run.overrides for run in runs}
    records, curves = _write_eval_steps(out, runs, rows, held_out_reward)
    (out / "sweep.md").write_text(_markdown(rows, cell_overrides, held_out_reward)
                                  + "\n".join(_proxy_gold_lines(curves, cell_overrides) + equal_time_lines(records, list(cell_overrides)))
                                  + ("\n" if curves else ""))
    _figure(out, rows, cell_overrides, runs, curves, held_out_reward)
    return rows


def _markdown(rows: list[dict], cell_overrides: dict[int, tuple[str, ...]], held_out_reward: str | None) -> str:
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
    metric = ("the demo's metric (mean reward of the eval samples per held-out prompt)" if held_out_reward is None
              else f"the reward component `{held_out_reward}` of the eval samples (mean per held-out prompt)")
    lines += ["", ("Mean ± standard error over seeds (sample std / sqrt(n)); held-out: " + metric + "; after - cell 0 "
                   "is the mean over the seeds both cells finished of (after - cell 0's after), with its standard error; evaluator: the demo's "
                   "held-out evaluator (a second judge, never a reward) on the same samples, n/a without one.")]
    return "\n".join(lines) + "\n"


def _colour(cell: int) -> tuple:
    """Cell `cell`'s colour in every panel: 20 distinct ones (matplotlib's tab20, dark shades first)."""
    from matplotlib import colormaps
    return colormaps["tab20"](2 * cell % 20 + cell // 10 % 2)


def _figure(out: Path, rows: list[dict], cell_overrides: dict[int, tuple[str, ...]], runs: list[Run],
            proxy_gold: dict[int, list[tuple[int, float, float]]], held_out_reward: str | None) -> None:
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
            bars.bar(c + offset, 0 if math.isnan(mean) else mean, width=0.4, alpha=alpha, color=_colour(c),
                     yerr=None if math.isnan(se) else se, capsize=3, label=key if c == 0 else None)
        steps: dict[int, list[float]] = {}
        for run in runs:
            if run.cell == c and any(r["cell"] == c and r["seed"] == run.seed for r in rs):
                for step, value in _curve(out / "runs" / run.dirname, held_out_reward):
                    steps.setdefault(step, []).append(value)
        if steps:
            xs = sorted(steps)
            stats = [_mean_se(steps[x]) for x in xs]
            ys = [m for m, _ in stats]
            ses = [0.0 if math.isnan(s) else s for _, s in stats]
            curves.plot(xs, ys, color=_colour(c), label=label)
            curves.fill_between(xs, [y - s for y, s in zip(ys, ses)], [y + s for y, s in zip(ys, ses)],
                                color=_colour(c), alpha=0.2)
    bars.set_xticks(list(cell_overrides), [str(c) for c in cell_overrides])
    bars.set_xlabel("cell")
    bars.set_ylabel("held-out reward (mean ± SE over seeds)")
    bars.legend(fontsize=7)
    curves.set_xlabel("RL step")
    curves.set_ylabel(f"training {'reward_mean' if held_out_reward is None else 'reward/' + held_out_reward} "
                      "(mean ± SE over seeds)")
    # the cells' full settings under the plots, one line each (numbered as the bars and sweep.md)
    handles = curves.get_lines()
    fig.legend(handles, [h.get_label() for h in handles], loc="lower center", ncol=1, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.045 * len(cell_overrides) / (1 + 0.045 * len(cell_overrides)) + 0.02, 1, 1))
    fig.savefig(out / "sweep.png", dpi=110)


def _proxy_gold_panel(ax, proxy_gold: dict[int, list[tuple[int, float, float]]]) -> None:
    """Per cell, the evaluations in step order: proxy on x, gold on y, the last one marked."""
    for c, points in proxy_gold.items():
        xs, ys = [p for _, p, _ in points], [g for _, _, g in points]
        ax.plot(xs, ys, "-o", color=_colour(c), markersize=3)
        ax.annotate(str(c), (xs[-1], ys[-1]), color=_colour(c), fontsize=8, xytext=(3, 3), textcoords="offset points")
        ax.plot(xs[-1:], ys[-1:], "s", color=_colour(c), markersize=7)
    ax.set_xlabel("proxy: held-out reward (mean over seeds)")
    ax.set_ylabel("gold: held-out evaluator (mean over seeds)")
    ax.set_title("proxy against gold per evaluation (square: the last)", fontsize=9)
