"""Cells that train at different speeds compared at equal training time: sweep.md's table, and
scripts/compare_sweeps.py over cells of different sweeps."""

from __future__ import annotations

from mmrl.experiments.sweep_runs import fmt_mean_se, mean_se


def at_time(points: list[dict], t: float) -> dict[str, float] | None:
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
    pace = {c: mean_se([p[-1]["train_s"] / p[-1]["step"] for (cell, _), p in by_run.items() if cell == c])[0]
            for c in cells}
    table = {}
    for c in cells:
        at = [v for (cell, _), p in by_run.items() if cell == c and (v := at_time(p, t)) is not None]
        if at:
            table[c] = {"s_per_step": pace[c], "speed": pace[cells[0]] / pace[c], "runs": len(at),
                        **{k: mean_se([v[k] for v in at]) for k in ("step", "proxy", "gold")}}
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
                     f"{fmt_mean_se(*row['proxy'])} | {fmt_mean_se(*row['gold'])} |")
    return lines
