"""``sweep.png``: held-out reward bars per cell (before and after, mean ± SE over seeds), each cell's
training reward curve, and, where the runs have an evaluator, the proxy against the gold per cell."""

from __future__ import annotations

import math
from pathlib import Path

from mmrl.experiments.sweep_grid import Run
from mmrl.experiments.sweep_runs import training_curve, mean_se


def cell_colour(cell: int) -> tuple:
    """Cell `cell`'s colour in every panel: 20 distinct ones (matplotlib's tab20, dark shades first)."""
    from matplotlib import colormaps
    return colormaps["tab20"](2 * cell % 20 + cell // 10 % 2)


def write_figure(out: Path, rows: list[dict], cell_overrides: dict[int, tuple[str, ...]], runs: list[Run],
            proxy_gold: dict[int, list[tuple[int, float, float]]], held_out_reward: str | None) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    panels = 3 if proxy_gold else 2
    fig = Figure(figsize=(6 * panels, 4.5 + 0.2 * len(cell_overrides)))
    FigureCanvasAgg(fig)
    bars, curves = fig.add_subplot(1, panels, 1), fig.add_subplot(1, panels, 2)
    if proxy_gold:
        proxy_gold_panel(fig.add_subplot(1, panels, 3), proxy_gold)
    labels = [f"{c}: " + (" ".join(ov) or "(base)") for c, ov in cell_overrides.items()]
    for c, label in zip(cell_overrides, labels):
        rs = [r for r in rows if r["cell"] == c]
        for offset, key, alpha in ((-0.2, "before", 0.4), (0.2, "after", 1.0)):
            mean, se = mean_se([r[key] for r in rs])
            bars.bar(c + offset, 0 if math.isnan(mean) else mean, width=0.4, alpha=alpha, color=cell_colour(c),
                     yerr=None if math.isnan(se) else se, capsize=3, label=key if c == 0 else None)
        steps: dict[int, list[float]] = {}
        for run in runs:
            if run.cell == c and any(r["cell"] == c and r["seed"] == run.seed for r in rs):
                for step, value in training_curve(out / "runs" / run.dirname, held_out_reward):
                    steps.setdefault(step, []).append(value)
        if steps:
            xs = sorted(steps)
            stats = [mean_se(steps[x]) for x in xs]
            ys = [m for m, _ in stats]
            ses = [0.0 if math.isnan(s) else s for _, s in stats]
            curves.plot(xs, ys, color=cell_colour(c), label=label)
            curves.fill_between(xs, [y - s for y, s in zip(ys, ses)], [y + s for y, s in zip(ys, ses)],
                                color=cell_colour(c), alpha=0.2)
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


def proxy_gold_panel(ax, proxy_gold: dict[int, list[tuple[int, float, float]]]) -> None:
    """Per cell, the evaluations in step order: proxy on x, gold on y, the last one marked."""
    for c, points in proxy_gold.items():
        xs, ys = [p for _, p, _ in points], [g for _, _, g in points]
        ax.plot(xs, ys, "-o", color=cell_colour(c), markersize=3)
        ax.annotate(str(c), (xs[-1], ys[-1]), color=cell_colour(c), fontsize=8, xytext=(3, 3), textcoords="offset points")
        ax.plot(xs[-1:], ys[-1:], "s", color=cell_colour(c), markersize=7)
    ax.set_xlabel("proxy: held-out reward (mean over seeds)")
    ax.set_ylabel("gold: held-out evaluator (mean over seeds)")
    ax.set_title("proxy against gold per evaluation (square: the last)", fontsize=9)
