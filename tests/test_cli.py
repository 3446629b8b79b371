"""The command line: help lists the registries, train runs a recipe with overrides, errors name
the key, and a user's reward file plugs in with no change to mmrl."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from helpers import TINY_RECIPE

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def mmrl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "mmrl", *map(str, args)], env=ENV, capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def test_help_lists_registries():
    out = mmrl("--help")
    assert out.returncode == 0
    for name in ("text_demo", "grounding", "latex", "examples:"):  # recipes, demos, examples
        assert name in out.stdout, name
    out = mmrl("list")  # every registered name (imports the plugins)
    assert out.returncode == 0
    for name in ("text_demo", "grpo", "rloo", "median", "pairwise", "ngrpo", "step", "token_mean",
                 "seq_mean_token_sum_norm", "k3", "sequence", "accuracy", "format", "length", "causal_lm"):
        assert name in out.stdout, name


def test_train_recipe_by_name_with_overrides(tmp_path):
    out = mmrl("train", "text_demo", f"output_dir={tmp_path}", "max_steps=2", "optim.prompts_per_step=2",
               "algorithm.group_size=2", "logging.progress=false", "policy.tiny_args.hidden=32",
               "policy.tiny_args.layers=1")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    for key in ("reward_mean", "reward/accuracy", "reward/format", "advantage_std", "loss", "kl", "clip_frac",
                "entropy", "time_step_s", "time_generate_s", "time_reward_s", "time_forward_s", "time_backward_s",
                "time_optimizer_s", "time_other_s"):
        assert key in lines[0], key
    assert (tmp_path / "plots" / "rewards.png").is_file()
    assert any((tmp_path / "tensorboard").iterdir())


def test_bad_key_is_a_clear_error(tmp_path):
    out = mmrl("train", "text_demo", "algorithm.bta=0.1")
    assert out.returncode == 2
    assert "algorithm.bta" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow  # 14 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
def test_user_reward_file_plugs_in(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "from mmrl import register_reward\n\n"
        "@register_reward('short_answer')\n"
        "def short_answer(prompts, completions, answer, **columns):\n"
        "    return [float(len(c) < 5) for c in completions]\n")
    recipe = dict(TINY_RECIPE, rewards={"short_answer": {"weight": 1.0}}, reward_modules=["my_rewards.py"],
                  output_dir=str(tmp_path / "run"), max_steps=1)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    out = mmrl("train", "r.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "reward/short_answer" in (tmp_path / "run" / "metrics.jsonl").read_text()
    evaluated = mmrl("eval", "r.yaml", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    result = json.loads(evaluated.stdout[evaluated.stdout.index("{"):])
    assert "reward/short_answer" in result and result["checkpoint"].endswith("step-000001")


def test_a_process_of_a_multi_process_run_exits_without_the_interpreter_teardown():
    """Under torchrun (WORLD_SIZE > 1) the entry point exits at once with main()'s code, its output
    flushed, and no teardown (an atexit handler does not run); it ends the process group after a
    success only (a failed process must not wait in a barrier for the others). A single process
    exits normally."""
    import os
    import subprocess
    import sys
    source = ("import atexit, sys, mmrl.cli.main as cli\n"
              "atexit.register(lambda: print('+teardown', end=''))\n"
              "cli.end_process_group = lambda: print('+group ended', end='')\n"
              "cli.main = lambda: print('finished', end='') or int(sys.argv[1])\n"
              "cli.run()\n")
    for world, code, out in (("2", 3, "finished"), ("2", 0, "finished+group ended"), ("1", 3, "finished+teardown")):
        done = subprocess.run([sys.executable, "-c", source, str(code)], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "WORLD_SIZE": world})
        assert done.returncode == code and done.stdout.strip() == out, (world, code, done.stdout, done.stderr[-1000:])
