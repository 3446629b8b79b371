"""The command line: one line for what the user wrote wrong, a full traceback for anything else,
YAML errors with file/line/column, recipe names that files cannot hide, help without torch, and
`mmrl eval` on a run's own config."""

import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.cli import commands
from mmrl.cli import main as cli
from mmrl.config.parse import parse_config
from mmrl.config.recipes import resolve_recipe
from mmrl.train.loop.trainer import Trainer


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_yaml_error_names_file_line_and_column(tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("task: causal_lm\npolicy: {model: x\nmax_steps: 3\n")
    code, _, err = run(capsys, "train", recipe)
    assert code == 2 and err.count("\n") == 1, err
    assert f"{recipe}:3:10: YAML syntax error" in err


def test_user_errors_are_one_line_and_debug_shows_the_traceback(tmp_path, capsys):
    code, _, err = run(capsys, "train", "text_demo", "algorithm.group_size=1", f"output_dir={tmp_path}")
    assert code == 2 and err == "mmrl: error: algorithm.group_size=1 must be >= 2 (advantages compare the rollouts of a group)\n"
    code, _, err = run(capsys, "train", "no_such_recipe")
    assert code == 2 and "unknown recipe 'no_such_recipe'; shipped recipes:" in err and "text_demo" in err
    code, _, err = run(capsys, "--debug", "train", "text_demo", "algorithm.group_size=1", f"output_dir={tmp_path}")
    assert code == 2 and "Traceback" in err and err.strip().endswith("must be >= 2 (advantages compare the rollouts of a group)")


def test_a_bug_keeps_its_traceback(monkeypatch):
    def broken(args):
        raise ValueError("an engine bug, not the user's")
    monkeypatch.setattr(commands, "run_train", broken)
    with pytest.raises(ValueError, match="an engine bug"):
        cli.main(["train", "text_demo"])


def test_a_folder_named_like_a_recipe_does_not_hide_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text_demo").mkdir()
    assert resolve_recipe("text_demo").name == "text_demo.yaml"
    assert resolve_recipe("text_demo").is_file()
    (tmp_path / "mine.yaml").write_text("{}")
    assert resolve_recipe("mine.yaml").resolve() == tmp_path / "mine.yaml"


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["demo", "--help"], ["eval", "--help"]])
def test_help_lists_recipes_and_demos_without_torch(argv):
    code = ("import sys, time; t = time.perf_counter(); from mmrl.cli.main import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO TORCH', time.perf_counter() - t)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=60)
    wall = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    assert "NO TORCH" in done.stdout
    assert "text_demo" in done.stdout or "demos:" in done.stdout
    assert wall < 5  # about 0.4 s on an idle core; generous on a loaded test machine


def test_eval_uses_the_run_config_refuses_an_untrained_model_and_writes_scores(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = parse_config(TINY_RECIPE, tiny_overrides(out, max_steps=1) + ["optim.lora.r=4", "optim.lora.alpha=8"])
    Trainer(cfg).train()
    checkpoint = out / "checkpoints" / "step-000001"
    # no recipe: the run's config.json (a LoRA run) is used; overrides come after the option
    code, stdout, err = run(capsys, "eval", "--checkpoint", checkpoint, "eval.max_prompts=2", "eval.group_size=2")
    assert code == 0, err
    scores = json.loads((out / "checkpoints" / "step-000001.eval.json").read_text())
    assert scores == json.loads(stdout[stdout.index("{"):])
    assert scores["checkpoint"] == str(checkpoint) and "reward_mean" in scores

    recipe = tmp_path / "fresh.yaml"
    recipe.write_text(yaml.safe_dump(dict(TINY_RECIPE, output_dir=str(tmp_path / "fresh"))))
    code, _, err = run(capsys, "eval", recipe, "eval.max_prompts=2")
    assert code == 2 and "has no checkpoint to score; pass --checkpoint DIR, or --base" in err
    code, stdout, err = run(capsys, "eval", recipe, "--base", "eval.max_prompts=2", "eval.group_size=2")
    assert code == 0, err
    assert json.loads((tmp_path / "fresh" / "base.eval.json").read_text())["checkpoint"] is None


def test_eval_of_data_without_held_out_rows_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import mmrl.train.loop.parts as parts

    def refuse(*args, **kwargs):
        raise AssertionError("the policy was built")
    monkeypatch.setattr(parts, "build_policy", refuse)
    rows = tmp_path / "train.jsonl"
    rows.write_text(json.dumps({"prompt": "2+2=", "answer": "4"}) + "\n")
    recipe = tmp_path / "no_eval.yaml"
    recipe.write_text(yaml.safe_dump({**TINY_RECIPE, "data": {"path": str(rows)}, "output_dir": str(tmp_path / "run")}))
    code, _, err = run(capsys, "eval", recipe, "--base")
    assert code == 2 and err == (f"mmrl: error: eval: the data ({rows}) has no held-out rows to score; set "
                                 f"data.eval_path (a held-out file, or a data set with data.eval_split)\n"), err


def test_eval_base_scores_the_untrained_model_and_another_recipe_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    recipe = tmp_path / "run.yaml"
    recipe.write_text(yaml.safe_dump(dict(TINY_RECIPE, output_dir=str(out), max_steps=1, optim={
        **TINY_RECIPE["optim"], "lr": 0.05})))
    code, _, err = run(capsys, "train", recipe)
    assert code == 0 and (out / "checkpoints" / "step-000001").is_dir(), err
    small = ["eval.max_prompts=4", "eval.group_size=2"]
    code, stdout, err = run(capsys, "eval", recipe, "--base", *small)
    assert code == 0, err
    assert err.startswith(f"mmrl eval: using the run's own config {out / 'config.json'} (as it was trained)")
    base = json.loads((out / "base.eval.json").read_text())
    assert base["checkpoint"] is None and not (out / "checkpoints" / "step-000001.eval.json").exists()
    # the same untrained model scored where there is no run at all
    fresh = tmp_path / "fresh.yaml"
    fresh.write_text(yaml.safe_dump(dict(TINY_RECIPE, output_dir=str(tmp_path / "fresh"))))
    assert run(capsys, "eval", fresh, "--base", *small)[0] == 0
    untrained = json.loads((tmp_path / "fresh" / "base.eval.json").read_text())
    assert base["reward_mean"] == untrained["reward_mean"] and base["greedy_reward_mean"] == untrained["greedy_reward_mean"]
    code, _, err = run(capsys, "eval", recipe, *small)  # the trained checkpoint, as before
    assert code == 0 and json.loads((out / "checkpoints" / "step-000001.eval.json").read_text())["checkpoint"]

    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(dict(TINY_RECIPE, output_dir=str(out), policy={
        **TINY_RECIPE["policy"], "model": "tiny:dlm-char"})))
    code, _, err = run(capsys, "eval", other, *small)
    assert code == 2 and err == (f"mmrl: error: mmrl eval: recipe '{other}' is task=causal_lm model='tiny:dlm-char', "
                                 f"but the run ({out / 'config.json'}) is task=causal_lm model='tiny:qwen2-char'; give "
                                 f"that run's recipe, --checkpoint alone, or another output_dir\n"), err
    code, _, err = run(capsys, "eval", recipe, "--base", "--checkpoint", out / "checkpoints" / "step-000001")
    assert code == 2 and "--base scores the untrained model and --checkpoint a trained one" in err
