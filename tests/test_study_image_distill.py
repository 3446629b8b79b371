"""scripts/study_image_distill.py on two small hand-made sweeps: the second sweep's cells numbered on
after the first's, each cell's end-of-run means, its after - cell 0 and its evaluation at one step
minus cell 0's there, paired by seed, by hand."""

import csv
import importlib.util
import json
import math
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "study_image_distill.py"
FIELDS = ("cell", "seed", "before", "after", "greedy_after", "eval_before", "eval_after")


def load_script():
    spec = importlib.util.spec_from_file_location("study_image_distill", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_sweep(folder: Path, cells: int, rows: list[tuple], evals: list[tuple]) -> Path:
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps({"cells": [[f"x={i}"] for i in range(cells)]}))
    with open(folder / "sweep.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        w.writerows(rows)
    with open(folder / "sweep_evals.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("cell", "seed", "step", "proxy", "gold"))
        w.writerows(evals)
    return folder


def test_a_later_sweeps_cells_follow_and_pair_with_cell_0_by_seed(tmp_path):
    study = load_script()
    first = write_sweep(tmp_path / "a", 2, [(0, 0, .5, .6, .6, .4, .5), (0, 1, .5, .8, .7, .4, .3),
                                            (1, 0, .5, .5, .5, .4, .4), (1, 1, .5, .7, .7, .4, .2)],
                        [(0, 0, 20, .6, .5), (1, 1, 20, .7, "nan")])
    later = write_sweep(tmp_path / "b", 1, [(0, 0, .5, .9, .8, .4, .7), (0, 1, .5, .6, .6, .4, .6)],
                        [(0, 0, 20, .9, .7), (0, 1, 20, .5, .6)])
    table = study.final_table([first, later], {"0": "grpo", "2": "tdm_r1"})
    assert list(table) == ["grpo", "1", "tdm_r1"]
    mean, se = table["tdm_r1"]["after"]
    assert abs(mean - 0.75) < 1e-12 and abs(se - 0.15) < 1e-12  # sd of (.9, .6) is .3 / sqrt 2; / sqrt 2
    mean, se = table["tdm_r1"]["reward_after_minus_cell_0"]  # (.9 - .6, .6 - .8)
    assert abs(mean - 0.05) < 1e-12 and abs(se - 0.25) < 1e-12
    mean, _ = table["tdm_r1"]["judge_after_minus_cell_0"]  # (.7 - .5, .6 - .3)
    assert abs(mean - 0.25) < 1e-12
    assert table["grpo"]["reward_after_minus_cell_0"][0] == 0.0
    steps = study.curves([first, later])
    assert steps["2"][20]["gold"] == [0.7, 0.6] and steps["1"][20]["gold"] == [] and steps["1"][20]["proxy"] == [0.7]
    assert math.isnan(study.mean_se([1.0])[1])
    paired = study.paired_at_step([first, later], 20, {"2": "tdm_r1"})  # cell 0 evaluated seed 0 only
    assert list(paired) == ["0", "tdm_r1"] and paired["0"]["gold"][0] == 0.0  # cell 1: no seed evaluated by both
    assert abs(paired["tdm_r1"]["gold"][0] - 0.2) < 1e-12
    assert abs(paired["tdm_r1"]["proxy"][0] - 0.3) < 1e-12
