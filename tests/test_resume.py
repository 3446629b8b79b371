"""A run killed with SIGKILL, or stopped with SIGTERM (which saves a checkpoint at the end of the
current step), resumes from its newest checkpoint and logs what an uninterrupted run logs;
checkpoints are published atomically."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY_RECIPE
from safetensors.torch import load_file



def train(recipe, out, *extra, kill_at=None, signal="SIGKILL"):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MMRL_TEST_KILL_AT": str(kill_at or 0),
           "MMRL_TEST_KILL_SIGNAL": signal}
    cmd = [sys.executable, "-m", "mmrl", "train", str(recipe), f"output_dir={out}", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """The recipe (a 5-step run, checkpoints every 2 steps) and its uninterrupted run."""
    tmp = tmp_path_factory.mktemp("resume")
    here = Path(__file__).parent
    cfg = dict(TINY_RECIPE, max_steps=5, save_every=2,
               rewards={**TINY_RECIPE["rewards"], "killer": {"weight": 0.0}},
               reward_modules=TINY_RECIPE["reward_modules"] + [str(here / "kill_reward.py")],
               sampling={"strategy": "variance", "variance_reward": "accuracy"}, algorithm={"group_size": 4, "mu": 2})
    recipe = tmp / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(cfg))
    whole = train(recipe, tmp / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    return recipe, tmp / "whole"


def assert_same_run(whole, other):
    a = [json.loads(x) for x in (whole / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (other / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]  # no step logged twice, none missing
    for ra, rb in zip(a, b):
        for key in ra:
            if not key.startswith("time_") and ra[key] is not None:
                assert ra[key] == pytest.approx(rb[key], abs=1e-6), (ra["step"], key)
    wa = load_file(whole / "checkpoints" / "step-000005" / "model" / "model.safetensors")
    wb = load_file(other / "checkpoints" / "step-000005" / "model" / "model.safetensors")
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_killed_run_resumes_exactly(whole_run, tmp_path):
    recipe, whole = whole_run
    killed = train(recipe, tmp_path / "killed", kill_at=4)
    assert killed.returncode == -9  # SIGKILL during step 4
    ckpts = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    assert ckpts == ["step-000002"]
    resumed = train(recipe, tmp_path / "killed", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(whole, tmp_path / "killed")  # step 3, logged before the kill, is not duplicated


@pytest.mark.slow  # 15 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
def test_sigterm_saves_the_step_and_resumes_exactly(whole_run, tmp_path):
    recipe, whole = whole_run
    stopped = train(recipe, tmp_path / "stopped", kill_at=3, signal="SIGTERM")  # during step 3's rollout
    assert stopped.returncode == 128 + 15, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert "SIGTERM" in last and "step-000003" in last and "resume=true" in last, last
    ckpts = sorted(p.name for p in (tmp_path / "stopped" / "checkpoints").iterdir())
    assert ckpts == ["step-000002", "step-000003"]  # step 3 finished and saved before stopping
    metrics = (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in metrics] == [1, 2, 3]  # flushed
    resumed = train(recipe, tmp_path / "stopped", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "step-000003" in resumed.stdout
    assert_same_run(whole, tmp_path / "stopped")


@pytest.mark.slow  # 15 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
def test_a_failing_reward_saves_the_last_step_and_resumes_exactly(whole_run, tmp_path):
    recipe, whole = whole_run
    failed = train(recipe, tmp_path / "failed", kill_at=4, signal="raise")  # the reward raises in step 4
    assert failed.returncode == 1
    assert "RuntimeError: the killer reward fails on call 4" in failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert "the run failed after step 3, which is saved in" in last and "step-000003" in last, last
    ckpts = sorted(p.name for p in (tmp_path / "failed" / "checkpoints").iterdir())
    assert ckpts == ["step-000002", "step-000003"]  # steps 3's work is kept, no temporary directory
    resumed = train(recipe, tmp_path / "failed", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(whole, tmp_path / "failed")  # step 4 draws the prompts it would have drawn


def test_checkpoint_loads_with_from_pretrained(tmp_path):
    """A full fine-tune of the tiny text model (its output head tied to its input embedding): the
    checkpoint's model/ loads with the Auto classes, its tokenizer encodes and decodes as the run's
    did (spaces kept), its logits equal those of the resume weights (model.safetensors, written by
    accelerate), and saving printed nothing about the tied head."""
    from mmrl.tasks.demos.tiny_models import char_tokenizer, qwen2_char
    from transformers import AutoModelForCausalLM, AutoTokenizer
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(dict(TINY_RECIPE, max_steps=1)))
    done = train(recipe, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "shared tensor" not in done.stdout + done.stderr
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000001"
    model = AutoModelForCausalLM.from_pretrained(checkpoint / "model")
    tok = AutoTokenizer.from_pretrained(checkpoint / "model")
    assert model.config.vocab_size == len(tok) and model.config.tie_word_embeddings
    text = "What is 3 + 4?\n<answer> 7 </answer>"
    assert tok.decode(tok.encode(text)) == text and tok.encode(text) == char_tokenizer().encode(text)
    resumed, _ = qwen2_char(**TINY_RECIPE["policy"]["tiny_args"], seed=1)
    missing, unexpected = resumed.load_state_dict(load_file(checkpoint / "model.safetensors"), strict=False)
    assert (missing, unexpected) == (["lm_head.weight"], [])  # tied: the embedding is the head
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, resumed(ids).logits)
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "run" / "checkpoints").iterdir())
