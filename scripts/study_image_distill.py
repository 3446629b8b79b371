"""The image distillation study's figures (docs/results/distill_image/), from a finished `mmrl sweep t2i`
whose cells are a 4-step student of the t2i demo's warm-started generator trained by the demo's
DanceGRPO, by DMD2 and by DMDR (the command is in the README):

1. the held-out judge (the demo's CNN judge, `gold` in the sweep's `sweep_evals.csv`) and the held-out
   reward (`proxy`) against RL steps, each cell's mean and standard error over seeds -> OUT/judge.png,
   the numbers in OUT/study.json;
2. each cell's seed-0 `plots/samples.png` (the held-out prompts, the student's greedy 4-step drawings
   before and after) side by side -> OUT/samples.png.

    python scripts/study_image_distill.py --sweep /tmp/study_dmd/sweep --out docs/results/distill_image \\
        --names grpo dmd2 dmdr
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path


def curves(sweep: Path) -> dict[str, dict[int, dict[str, list[float]]]]:
    """cell -> step -> {"gold": [per seed], "proxy": [per seed]} from the sweep's periodic evaluations."""
    out: dict = defaultdict(lambda: defaultdict(lambda: {"gold": [], "proxy": []}))
    with open(sweep / "sweep_evals.csv") as f:
        for row in csv.DictReader(f):
            for key in ("gold", "proxy"):
                if row[key] not in ("", "nan"):
                    out[row["cell"]][int(row["step"])][key].append(float(row[key]))
    return out


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    return mean, sd / math.sqrt(n)


def judge_figure(data: dict, names: dict[str, str], path: Path) -> dict:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    table = {}
    for cell, steps in data.items():
        label = names.get(cell, cell)
        xs = sorted(steps)
        table[label] = {str(s): {k: mean_se(steps[s][k]) for k in ("gold", "proxy") if steps[s][k]} for s in xs}
        for ax, key in zip(axes, ("gold", "proxy")):
            points = [(s, *mean_se(steps[s][key])) for s in xs if steps[s][key]]
            ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                        capsize=3, label=label)
    axes[0].set(title="held-out judge (colour and shape right)", xlabel="RL step", ylabel="judge, sampled mean")
    axes[1].set(title="held-out reward (colour_shape)", xlabel="RL step", ylabel="reward, sampled mean")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return table


def samples_figure(sweep: Path, cells: list[list[str]], names: dict[str, str], path: Path) -> None:
    from PIL import Image, ImageDraw

    from mmrl.experiments.sweep_grid import Run
    tiles = []
    for index, overrides in enumerate(cells):
        figure = sweep / "runs" / Run(index, tuple(overrides), 0).dirname / "plots" / "samples.png"
        if figure.is_file():
            tiles.append((names.get(str(index), str(index)), Image.open(figure).convert("RGB")))
    width = sum(t.width for _, t in tiles)
    height = max(t.height for _, t in tiles) + 24
    canvas = Image.new("RGB", (width, height), "white")
    x = 0
    for label, tile in tiles:
        canvas.paste(tile, (x, 24))
        ImageDraw.Draw(canvas).text((x + 8, 6), label, fill="black")
        x += tile.width
    canvas.save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--names", nargs="*", default=[], help="a name per cell, in the sweep's cell order")
    args = parser.parse_args()
    cells = json.loads((args.sweep / "sweep.json").read_text())["cells"]
    names = {str(i): name for i, name in enumerate(args.names)}
    args.out.mkdir(parents=True, exist_ok=True)
    table = judge_figure(curves(args.sweep), names, args.out / "judge.png")
    samples_figure(args.sweep, cells, names, args.out / "samples.png")
    (args.out / "study.json").write_text(json.dumps({"cells": names, "by_step_mean_se": table}, indent=1))
    print(json.dumps({"cells": names, "last": {k: v[max(v, key=int)] for k, v in table.items()}}, indent=1))


if __name__ == "__main__":
    main()
