"""`mmrl sweep`: the grid x seeds as separate processes, resuming, one cached warm start per seed,
and the reports (csv rows, mean and standard error per cell, paired differences)."""

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmrl.cli import main as cli
from mmrl.config.parse import load_recipe
from mmrl.errors import UserError
from mmrl.experiments.sweep import sweep
from mmrl.experiments.sweep_grid import Run, cells, parse_cells, parse_grid, parse_shard, plan, split_values
from mmrl.experiments.sweep_report import write_reports
from mmrl.experiments.sweep_runs import training_curve as _curve
from mmrl.experiments.warm_start_cache import warm_key
from mmrl.registry import DEMOS, RECIPES

ROOT = Path(__file__).resolve().parents[1]
# the text demo shrunk to seconds per run
TINY = ["max_steps=2", "warm_start.steps=2", "warm_start.batch_size=4", "eval.max_prompts=4",
        "eval.group_size=2", "optim.prompts_per_step=2", "optim.micro_batch_size=4", "algorithm.group_size=2",
        "policy.max_new_tokens=8", "policy.tiny_args.hidden=32", "logging.report_to=[none]",
        "logging.progress=false", "save_every=0", "data.args.n_train=64", "data.args.n_eval=4"]


def _env():
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "HF_HUB_OFFLINE": "1"}


def _rows(out: Path) -> list[dict]:
    with open(out / "sweep.csv") as f:
        return list(csv.DictReader(f))


def test_grid_parsing_plan_and_shards():
    assert split_values("1,[a, b],{x: 1, y: 2}") == ["1", "[a, b]", "{x: 1, y: 2}"]
    grid = parse_grid(["algorithm.estimator=grpo,rloo", "optim.lr=1e-4,1e-3,1e-2"])
    assert len(cells(grid)) == 6 and cells(grid)[1] == ("algorithm.estimator=grpo", "optim.lr=1e-3")
    runs = plan(cells(grid), 2)
    assert len(runs) == 12 and len({r.dirname for r in runs}) == 12
    assert parse_shard("1/3") == (1, 3)
    bundles = parse_cells(["algorithm.estimator=pairwise algorithm.group_size=2", "algorithm.estimator=grpo"])
    assert cells(parse_grid(["seed_offset=1,2"]), bundles) == [
        ("algorithm.estimator=pairwise", "algorithm.group_size=2", "seed_offset=1"),
        ("algorithm.estimator=pairwise", "algorithm.group_size=2", "seed_offset=2"),
        ("algorithm.estimator=grpo", "seed_offset=1"), ("algorithm.estimator=grpo", "seed_offset=2")]
    assert cells([], bundles) == bundles
    with pytest.raises(UserError, match="--cell"):
        parse_cells(["algorithm.estimator"])
    for bad in ["x", "a=", "=1", "a=1,,2"]:
        with pytest.raises(UserError, match="--grid"):
            parse_grid([bad])
    with pytest.raises(UserError, match="twice"):
        parse_grid(["a=1", "a=2"])
    for bad in ["3/3", "1-2", "a/b"]:
        with pytest.raises(UserError, match="--shard"):
            parse_shard(bad)


def test_warm_start_key_reads_only_what_the_warm_start_reads():
    recipe = RECIPES.get(DEMOS.get("text"))
    key = warm_key(load_recipe(recipe), [])
    assert warm_key(load_recipe(recipe, ["algorithm.estimator=rloo", "optim.lr=1e-3", "max_steps=3"]), []) == key
    assert warm_key(load_recipe(recipe, ["seed=1"]), []) != key
    assert warm_key(load_recipe(recipe, ["warm_start.steps=7"]), []) != key
    assert warm_key(load_recipe(recipe, ["policy.temperature=0.5"]), []) != key
    assert warm_key(load_recipe(recipe, ["policy.temperature=0.5"]), ["policy.temperature"]) == warm_key(
        load_recipe(recipe), ["policy.temperature"])


def test_report_means_standard_errors_and_paired_differences(tmp_path):
    runs = plan([("a=1",), ("a=2",)], 3)
    after = {(0, 0): 0.1, (0, 1): 0.3, (0, 2): 0.2, (1, 0): 0.4, (1, 1): 0.5, (1, 2): 0.9}
    for run in runs:
        d = tmp_path / "runs" / run.dirname
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"before": 0.0, "after": after[run.cell, run.seed],
                                                    "greedy_before": 0.0, "greedy_after": 0.5, "wall_s": 1.0}))
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": s * 0.1}) + "\n" for s in (1, 2)))
    (tmp_path / "runs" / runs[-1].dirname / "summary.json").write_text('{"before": 0.0')  # an unfinished run
    rows = write_reports(tmp_path, runs)
    assert len(rows) == 5 and len(_rows(tmp_path)) == 5
    md = (tmp_path / "sweep.md").read_text()
    # cell 0: 0.1, 0.3, 0.2 -> 0.2 ± sqrt(0.01 / 3); cell 1: 0.4, 0.5 -> 0.45 ± 0.05;
    # paired differences 0.3, 0.2 -> 0.25 ± 0.05
    assert f"0.200 ± {math.sqrt(0.01 / 3):.3f}" in md
    assert "| 1: a=2 | 2 | 0.000 ± 0.000 | 0.450 ± 0.050 | 0.450 ± 0.050 | 0.500 ± 0.000 | 0.250 ± 0.050 |" in md
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_proxy_against_gold_at_every_evaluation(tmp_path):
    """Cell 1 keeps raising the proxy while its gold falls after step 2: the table says so per cell,
    with the means over seeds; sweep_evals.csv holds every evaluation of every run."""
    runs = plan([("a=1",), ("a=2",)], 2)
    evals = {0: [(0.5, 0.4), (0.6, 0.5), (0.7, 0.6)], 1: [(0.5, 0.4), (0.7, 0.6), (0.9, 0.3)]}
    for run in runs:
        d = tmp_path / "runs" / run.dirname
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"before": 0.0, "after": 0.5, "greedy_before": 0.0,
                                                    "greedy_after": 0.5, "wall_s": 1.0}))
        shift = 0.02 * run.seed  # the seeds differ; the table shows their mean (+0.01)
        lines = [{"step": s, "reward_mean": 0.1, "time_step_s": 0.5} for s in (1, 2, 3)]
        lines += [{"step": 2 * (i + 1), "reward_mean": 0.2, "time_step_s": 1.0, "eval/reward_mean": proxy + shift,
                   "eval/eval_mean": gold + shift} for i, (proxy, gold) in enumerate(evals[run.cell])]
        (d / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
    write_reports(tmp_path, runs)
    with open(tmp_path / "sweep_evals.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and {r["step"] for r in rows} == {"2", "4", "6"}
    assert [float(r["train_s"]) for r in rows[:3]] == [2.5, 3.5, 4.5]  # the steps' times summed up to each evaluation
    md = (tmp_path / "sweep.md").read_text()
    assert "| 0 | 0.510 -> 0.710 | 0.410 -> 0.610 | 0.610 (6) | +0.000, +0.000 |" in md
    assert "| 1 | 0.510 -> 0.910 | 0.410 -> 0.310 | 0.610 (4) | +0.200, -0.300 |" in md
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_cells_compared_at_equal_training_time(tmp_path):
    """Cell 1 trains twice as fast: at T = 3 s (its last evaluation) cell 0 is halfway between its
    evaluations at 2 s and 4 s, cell 1 at its last; each value is the mean over seeds (+0.01) ± SE."""
    runs = plan([("a=1",), ("a=2",)], 2)
    step_s, evals = {0: 1.0, 1: 0.5}, {0: [(0.2, 0.1), (0.4, 0.2), (0.6, 0.3)], 1: [(0.3, 0.2), (0.5, 0.3), (0.9, 0.5)]}
    for run in runs:
        d = tmp_path / "runs" / run.dirname
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"before": 0.0, "after": 0.5, "greedy_before": 0.0,
                                                    "greedy_after": 0.5, "wall_s": 1.0}))
        lines = []
        for step in range(1, 7):
            row = {"step": step, "reward_mean": 0.1, "time_step_s": step_s[run.cell]}
            if step % 2 == 0:
                proxy, gold = evals[run.cell][step // 2 - 1]
                row.update({"eval/reward_mean": proxy + 0.02 * run.seed, "eval/eval_mean": gold + 0.02 * run.seed})
            lines.append(row)
        (d / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
    write_reports(tmp_path, runs)
    md = (tmp_path / "sweep.md").read_text()
    assert "T = 3.0 s" in md
    assert "| 0 | 1.000 | 1.00x | 3 | 0.310 ± 0.010 | 0.160 ± 0.010 |" in md
    assert "| 1 | 0.500 | 2.00x | 6 | 0.910 ± 0.010 | 0.510 ± 0.010 |" in md


@pytest.mark.slow  # 132 s in the default run on 2 cores beside two demos (2026-11-29); the default run stays under 15 min
def test_two_by_two_grid_two_seeds_one_warm_start_per_seed(tmp_path):
    out = tmp_path / "sweep"
    rc = sweep("text", ["algorithm.estimator=grpo,dr_grpo", "optim.lr=1e-4,1e-3"], 2, out, TINY, parallel=2,
               say=lambda *_: None)
    assert rc == 0
    rows = _rows(out)
    expected = {(f"algorithm.estimator={e} optim.lr={lr}", str(s))
                for e in ("grpo", "dr_grpo") for lr in ("1e-4", "1e-3") for s in (0, 1)}
    assert {(r["overrides"], r["seed"]) for r in rows} == expected and len(rows) == 8
    for r in rows:
        assert all(math.isfinite(float(r[k])) for k in ("before", "after", "greedy_before", "greedy_after", "wall_s",
                                                        "eval_before", "eval_after"))  # the text demo's evaluator
    md = (out / "sweep.md").read_text()
    assert sum(f"\n| {c}: algorithm.estimator=" in md for c in range(4)) == 4 and (out / "sweep.png").stat().st_size > 0
    # one warm start computed per seed; every other run of that seed loaded it
    log = [json.loads(line) for line in (out / "warm_starts" / "log.jsonl").read_text().splitlines()]
    assert sorted(entry["seed"] for entry in log) == [0, 1]
    records = {r["run_dir"]: json.loads((out / r["run_dir"] / "warm_start.json").read_text()) for r in rows}
    assert sum(not rec["reused"] for rec in records.values()) == 2
    # the loaded weights are the computed ones: a seed's held-out greedy samples before RL agree across cells
    greedy = {}
    for r in rows:
        before = json.loads((out / r["run_dir"] / "before.json").read_text())
        greedy.setdefault(r["seed"], set()).add(json.dumps(before["greedy_samples"]))
    assert all(len(samples) == 1 for samples in greedy.values())
    assert greedy["0"] != greedy["1"]


@pytest.mark.slow  # 65 s in the default run on 2 cores beside two demos (2026-11-29); the default run stays under 15 min
def test_a_killed_sweep_resumes_without_redoing_finished_runs(tmp_path):
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "mmrl", "sweep", "text", "--grid", "algorithm.estimator=grpo,dr_grpo",
           "--seeds", "1", "--out", str(out), *TINY]
    proc = subprocess.Popen(cmd, env=_env(), cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = plan(cells(parse_grid(["algorithm.estimator=grpo,dr_grpo"])), 1)
    first = out / "runs" / runs[0].dirname / "summary.json"
    deadline = time.time() + 600
    while not first.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its running run
    proc.wait()
    assert first.exists() and not (out / "runs" / runs[1].dirname / "summary.json").exists()
    stamp = first.stat().st_mtime_ns
    said = []
    assert sweep("text", ["algorithm.estimator=grpo,dr_grpo"], 1, out, TINY, say=said.append) == 0
    assert first.stat().st_mtime_ns == stamp
    assert any("1 to run" in line for line in said) and not any(f"start {runs[0].dirname}" in line for line in said)
    assert len(_rows(out)) == 2
    assert not json.loads((out / "runs" / runs[0].dirname / "warm_start.json").read_text())["reused"]
    assert json.loads((out / "runs" / runs[1].dirname / "warm_start.json").read_text())["reused"]


def test_bad_grid_key_fails_before_any_run(tmp_path):
    from mmrl.config.parse import ConfigError
    with pytest.raises(ConfigError, match="algorithm.nope"):
        sweep("text", ["algorithm.nope=1,2"], 1, tmp_path, TINY, say=lambda *_: None)
    assert not (tmp_path / "runs").exists()
    assert Run(0, ("a=1",), 0).dirname.endswith("/seed-0")


def test_output_dir_is_refused_naming_out(tmp_path, capsys):
    for common, grid, cell in (([*TINY, "output_dir=elsewhere"], ["optim.lr=1e-4,1e-3"], []),
                               (TINY, ["output_dir=a,b"], []), (TINY, [], ["optim.lr=1e-4 output_dir=b"])):
        with pytest.raises(UserError, match=r"'output_dir=.*' would be ignored: each run writes under --out DIR"):
            sweep("text", grid, 1, tmp_path / "sweep", common, say=lambda *_: None, cell_items=cell)
    assert not (tmp_path / "sweep").exists() and not Path("elsewhere").exists()
    code = cli.main(["sweep", "text", "--grid", "optim.lr=1e-4,1e-3", "--seeds", "1", "--out", str(tmp_path / "sweep"),
                     *TINY, f"output_dir={tmp_path / 'x'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "give --out instead of output_dir" in err, err


def test_parallel_runs_share_the_cores_unless_the_user_set_threads():
    from mmrl.experiments.sweep import run_environment
    cores = os.cpu_count() or 1
    assert run_environment(1, {})["OMP_NUM_THREADS"] == str(cores)
    assert run_environment(2 * cores, {})["OMP_NUM_THREADS"] == "1"
    assert run_environment(2, {"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"


def test_a_grid_value_that_is_not_a_registered_name_fails_before_any_run(tmp_path):
    from mmrl.config.parse import ConfigError
    from mmrl.core.estimators import ADVANTAGE_ESTIMATORS
    good = ADVANTAGE_ESTIMATORS.names()[0]
    with pytest.raises(ConfigError, match=r"mmrl sweep: cell algorithm.estimator=grpoo: algorithm.estimator: "
                                          r"'grpoo' is not a registered advantage estimator"):
        sweep("text", [f"algorithm.estimator={good},grpoo"], 1, tmp_path, TINY, say=lambda *_: None)
    assert not (tmp_path / "runs").exists()


def test_held_out_reward_names_one_component(tmp_path):
    """A cell trained on a win rate has a combined reward of 0.5 by construction; the table then
    compares every cell on the named component, before and after, greedy and in the evaluations."""
    runs = plan([("a=1",), ("a=2",)], 1)
    for run in runs:
        d = tmp_path / "runs" / run.dirname
        d.mkdir(parents=True)
        detail = {when: {"reward_mean": 0.5, "reward/shape": 0.2 + 0.1 * run.cell + (0.3 if when == "after" else 0.0),
                         "reward/win_rate": 0.5, "greedy/shape": 0.7, "greedy/win_rate": None}
                  for when in ("before", "after")}
        (d / "summary.json").write_text(json.dumps({
            "before": 0.5, "after": 0.5, "greedy_before": 0.0, "greedy_after": 0.0, "wall_s": 1.0,
            "before_detail": detail["before"], "after_detail": detail["after"]}))
        (d / "metrics.jsonl").write_text(json.dumps({"step": 2, "reward_mean": 0.5, "reward/shape": 0.3, "eval/reward_mean": 0.5,
                                                     "eval/reward/shape": 0.4, "eval/eval_mean": 0.6}) + "\n")
    rows = write_reports(tmp_path, runs, held_out_reward="shape")
    got = [v for r in rows for v in (r["before"], r["after"], r["greedy_after"])]
    assert got == pytest.approx([0.2, 0.5, 0.7, 0.3, 0.6, 0.7])
    assert "reward component `shape`" in (tmp_path / "sweep.md").read_text()
    assert {r["proxy"] for r in csv.DictReader(open(tmp_path / "sweep_evals.csv"))} == {"0.4"}
    assert _curve(tmp_path / "runs" / runs[0].dirname, "shape") == [(2, 0.3)]  # sweep.png's training curve
    with pytest.raises(UserError, match=r"--held-out-reward colour.*reward components: \['shape', 'win_rate'\]"):
        write_reports(tmp_path, runs, held_out_reward="colour")


def test_held_out_reward_must_be_a_reward_of_every_cell(tmp_path):
    with pytest.raises(UserError, match=r"--held-out-reward nope: cell algorithm.estimator=grpo has no such reward"):
        sweep("text", ["algorithm.estimator=grpo,rloo"], 1, tmp_path, TINY, say=lambda *_: None, held_out_reward="nope")
    assert not (tmp_path / "sweep.json").exists()
