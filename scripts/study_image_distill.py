"""The image distillation study's figures (docs/results/distill_image/), from a finished `mmrl sweep t2i`
whose cells are a 4-step student of the t2i demo's warm-started generator trained by the demo's
DanceGRPO, by DMD2 and by DMDR (the command is in the README):

1. the held-out judge (the demo's CNN judge, `gold` in the sweep's `sweep_evals.csv`) and the held-out
   reward (`proxy`) against RL steps, each cell's mean and standard error over seeds -> OUT/judge.png,
   the numbers in OUT/study.json;
2. each cell's seed-0 `plots/samples.png` (the held-out prompts, the student's greedy 4-step drawings
   before and after) side by side -> OUT/samples.png;
3. per cell, from the sweeps' `sweep.csv`: the held-out reward and judge before and after, the greedy
   reward after, and after - cell 0 paired by seed, mean and standard error over seeds; and each cell's
   judge and reward at one evaluation step (`--paired-step`) minus cell 0's there, paired by seed (for
   cells of different lengths) -> study.json.

Several sweeps of the same target and common settings may be given: their cells are numbered on in
the order given (a cell added later by its own `mmrl sweep`).

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


def sweep_rows(sweeps: list[Path], name: str) -> list[dict]:
    """The rows of each sweep's `name` CSV, their cell numbered on across the sweeps in order."""
    rows, offset = [], 0
    for sweep in sweeps:
        with open(sweep / name) as f:
            rows += [{**row, "cell": str(int(row["cell"]) + offset)} for row in csv.DictReader(f)]
        offset += len(json.loads((sweep / "sweep.json").read_text())["cells"])
    return rows


def curves(sweeps: list[Path]) -> dict[str, dict[int, dict[str, list[float]]]]:
    """cell -> step -> {"gold": [per seed], "proxy": [per seed]} from the sweeps' periodic evaluations."""
    out: dict = defaultdict(lambda: defaultdict(lambda: {"gold": [], "proxy": []}))
    for row in sweep_rows(sweeps, "sweep_evals.csv"):
        for key in ("gold", "proxy"):
            if row[key] not in ("", "nan"):
                out[row["cell"]][int(row["step"])][key].append(float(row[key]))
    return out


def final_table(sweeps: list[Path], names: dict[str, str]) -> dict:
    """cell name -> each end-of-run column's mean and SE over seeds, and after - cell 0 paired by seed."""
    by_cell: dict = defaultdict(dict)
    for row in sweep_rows(sweeps, "sweep.csv"):
        by_cell[row["cell"]][row["seed"]] = {k: float(row[k]) for k in FINAL_COLUMNS}
    table = {}
    for cell, seeds in sorted(by_cell.items(), key=lambda kv: int(kv[0])):
        entry = {k: mean_se([v[k] for v in seeds.values()]) for k in FINAL_COLUMNS}
        for key, column in (("reward", "after"), ("judge", "eval_after")):
            paired = [v[column] - by_cell["0"][s][column] for s, v in seeds.items() if s in by_cell["0"]]
            entry[f"{key}_after_minus_cell_0"] = mean_se(paired)
        table[names.get(cell, cell)] = entry
    return table


FINAL_COLUMNS = ("before", "after", "greedy_after", "eval_before", "eval_after")


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    return mean, sd / math.sqrt(n)


def paired_at_step(sweeps: list[Path], step: int, names: dict[str, str]) -> dict:
    """cell name -> {gold, proxy: (mean, SE) over seeds of the cell's evaluation at `step` minus cell 0's
    there, paired by seed}: cells of different lengths compared where both evaluated."""
    at: dict = defaultdict(dict)
    for row in sweep_rows(sweeps, "sweep_evals.csv"):
        if int(row["step"]) == step:
            at[row["cell"]][row["seed"]] = row
    out: dict = defaultdict(dict)
    for cell, seeds in sorted(at.items(), key=lambda kv: int(kv[0])):
        for key in ("gold", "proxy"):
            diffs = [float(v[key]) - float(at["0"][s][key]) for s, v in seeds.items()
                     if s in at["0"] and "nan" not in (v[key], at["0"][s][key]) and "" not in (v[key], at["0"][s][key])]
            if diffs:
                out[names.get(cell, cell)][key] = mean_se(diffs)
    return dict(out)


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


def samples_figure(sweeps: list[Path], names: dict[str, str], path: Path) -> None:
    from PIL import Image, ImageDraw

    from mmrl.experiments.sweep_grid import Run
    tiles, index = [], 0
    for sweep in sweeps:
        for overrides in json.loads((sweep / "sweep.json").read_text())["cells"]:
            figure = sweep / "runs" / Run(index, tuple(overrides), 0).dirname / "plots" / "samples.png"
            if figure.is_file():
                tiles.append((names.get(str(index), str(index)), Image.open(figure).convert("RGB")))
            index += 1
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
    parser.add_argument("--sweep", type=Path, nargs="+", required=True,
                        help="one or more finished sweeps (sweep.json, sweep.csv, sweep_evals.csv)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--names", nargs="*", default=[], help="a name per cell, in the sweeps' cell order")
    parser.add_argument("--paired-step", type=int, default=20,
                        help="the evaluation step at which every cell is compared with cell 0, paired by seed")
    args = parser.parse_args()
    names = {str(i): name for i, name in enumerate(args.names)}
    args.out.mkdir(parents=True, exist_ok=True)
    table = judge_figure(curves(args.sweep), names, args.out / "judge.png")
    samples_figure(args.sweep, names, args.out / "samples.png")
    final = final_table(args.sweep, names)
    paired = paired_at_step(args.sweep, args.paired_step, names)
    (args.out / "study.json").write_text(json.dumps({"cells": names, "final_mean_se": final, "paired_step": args.paired_step,
                                                     "minus_cell_0_at_paired_step": paired, "by_step_mean_se": table}, indent=1))
    print(json.dumps({"cells": names, "final": final, "minus_cell_0_at_paired_step": paired}, indent=1))


if __name__ == "__main__":
    main()
