"""Cells of several `mmrl sweep` folders compared at equal training time: sweep.md's equal-time
table (mmrl/experiments/sweep_equal_time.py, `equal_time`) over cells that ran in different sweeps, e.g. the
rollout-worker cells of one sweep against a synchronous cell run in another with a different
thread layout (`OMP_NUM_THREADS=1`). Each argument is a sweep folder, optionally with the cells to
take from it (`FOLDER:0,2`; all by default); the first cell named is the one speeds are relative
to. Prints the markdown table, and the numbers as JSON with --json.

    python scripts/compare_sweeps.py docs/results/async/text_sync_one_core:0 docs/results/async/text:1,2,3
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from bench_report import emit


def cells_of(arg: str) -> tuple[Path, list[int] | None]:
    folder, _, picked = arg.partition(":")
    return Path(folder), [int(c) for c in picked.split(",")] if picked else None


def main() -> None:
    from mmrl.experiments.sweep_equal_time import equal_time, equal_time_lines
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", metavar="FOLDER[:CELLS]")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    records, labels = [], []
    for arg in args.sweeps:
        folder, picked = cells_of(arg)
        plan = json.loads((folder / "sweep.json").read_text())["cells"]
        with open(folder / "sweep_evals.csv") as f:
            rows = list(csv.DictReader(f))
        for cell in picked if picked is not None else range(len(plan)):
            label = f"{folder.name} {cell}: {' '.join(plan[cell]) or '(base)'}"
            labels.append(label)
            records += [{"cell": label, "seed": int(r["seed"]), "step": int(r["step"]), "train_s": float(r["train_s"]),
                         "proxy": float(r["proxy"]), "gold": float(r["gold"])} for r in rows if int(r["cell"]) == cell]
    print("\n".join(equal_time_lines(records, labels, first=labels[0])))
    compared = equal_time(records, labels)
    if compared is not None:
        t, table = compared
        emit({"T_s": t, "cells": table}, args.json)


if __name__ == "__main__":
    main()
