"""A run killed with SIGKILL resumes from its newest checkpoint and logs what an uninterrupted
run logs; checkpoints are published atomically."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import TINY_RECIPE

TIMING = ("time_rollout_s", "time_update_s")


def train(recipe, out, *extra, kill_at=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MMRL_TEST_KILL_AT": str(kill_at or 0)}
    cmd = [sys.executable, "-m", "mmrl", "train", str(recipe), f"output_dir={out}", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_killed_run_resumes_exactly(tmp_path):
    here = Path(__file__).parent
    cfg = dict(TINY_RECIPE, max_steps=5, save_every=2,
               rewards={**TINY_RECIPE["rewards"], "killer": {"weight": 0.0}},
               reward_modules=TINY_RECIPE["reward_modules"] + [str(here / "kill_reward.py")],
               sampling={"strategy": "variance", "variance_reward": "accuracy"}, algorithm={"group_size": 4, "mu": 2})
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(cfg))

    whole = train(recipe, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]

    killed = train(recipe, tmp_path / "killed", kill_at=4)
    assert killed.returncode == -9  # SIGKILL during step 4
    ckpts = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    assert ckpts == ["step-000002"]
    resumed = train(recipe, tmp_path / "killed", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    a = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]  # step 3, logged before the kill, is not duplicated
    for ra, rb in zip(a, b):
        for key in ra:
            if key not in TIMING and ra[key] is not None:
                assert ra[key] == pytest.approx(rb[key], abs=1e-6), (ra["step"], key)
    wa = load_file(tmp_path / "whole" / "checkpoints" / "step-000005" / "model" / "model.safetensors")
    wb = load_file(tmp_path / "killed" / "checkpoints" / "step-000005" / "model" / "model.safetensors")
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_checkpoint_loads_with_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(dict(TINY_RECIPE, max_steps=1)))
    done = train(recipe, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    path = tmp_path / "run" / "checkpoints" / "step-000001" / "model"
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.vocab_size == len(tok)
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "run" / "checkpoints").iterdir())
