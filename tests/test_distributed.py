"""1 process and 2 processes (gloo on CPU) give the same rewards, advantages, loss and weights."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import yaml
from helpers import TINY_RECIPE
from safetensors.torch import load_file


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(launcher, recipe, out, steps):
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = launcher + ["-m", "mmrl", "train", str(recipe), f"output_dir={out}", f"max_steps={steps}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_one_and_two_processes_agree(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    cfg = dict(TINY_RECIPE, algorithm={"group_size": 4, "beta": 0.04}, optim={**TINY_RECIPE["optim"],
               "micro_batch_size": 3})
    recipe.write_text(yaml.safe_dump(cfg))
    single = run_cli([sys.executable], recipe, tmp_path / "one", 3)
    double = run_cli([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                      "--master_addr", "127.0.0.1", "--master_port", str(free_port())], recipe, tmp_path / "two", 3)
    assert len(single) == len(double) == 3
    assert any(r["loss"] != 0 and r["skipped_frac"] < 1 and r["kl"] > 0 for r in single)  # real updates happened
    for a, b in zip(single, double):
        for key in ("reward_mean", "reward/accuracy", "reward/digit_share", "advantage_mean", "advantage_std",
                    "loss", "kl", "clip_frac", "entropy", "completion_length", "skipped_frac"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
    w1 = load_file(tmp_path / "one" / "checkpoints" / "step-000003" / "model" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "checkpoints" / "step-000003" / "model" / "model.safetensors")
    assert w1.keys() == w2.keys()
    for name in w1:
        assert torch.allclose(w1[name], w2[name], atol=1e-6), name


@pytest.mark.slow  # 17 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
def test_a_group_reward_sees_whole_groups_on_two_processes(tmp_path):
    """Each process scores whole groups (a draw's groups are split in blocks of whole groups), so a
    win rate, scored while the next group generates, is the same on 1 and 2 processes."""
    recipe = tmp_path / "recipe.yaml"
    prefer = f"{os.path.dirname(__file__)}/length_preference.py:longer"
    cfg = dict(TINY_RECIPE, rewards={"win_rate": {"weight": 1.0, "args": {"prefer": prefer}}},
               scoring={"groups_per_call": 1})
    recipe.write_text(yaml.safe_dump(cfg))
    single = run_cli([sys.executable], recipe, tmp_path / "one", 2)
    double = run_cli([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                      "--master_addr", "127.0.0.1", "--master_port", str(free_port())], recipe, tmp_path / "two", 2)
    for a, b in zip(single, double):
        for key in ("reward/win_rate", "reward_std", "advantage_std", "loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
    assert single[0]["reward_std"] > 0


@pytest.mark.slow  # 39 s in the default run on 2 cores beside two demos (2026-11-29); the default run stays under 15 min
def test_episodes_agree_on_one_and_two_processes(tmp_path):
    """Episodes with tool calls (a warm start teaches the tiny model to call `add` for "2+3"): the
    same turns, tool calls, truncations, rewards, loss and weights on 1 and 2 processes."""
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    rows = [{"prompt": "2+3", "answer": "5", "target": call + "<eos>t:5<eos>a:<answer>5</answer>"},
            {"prompt": "4+3", "answer": "7", "target": "<answer>7</answer>"}] * 2
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "task": "causal_lm", "seed": 0, "save_every": 3,
        "policy": {"model": "tiny:qwen2-chat-char", "tiny_args": {"hidden": 64, "layers": 2, "heads": 2},
                   "max_new_tokens": 80, "temperature": 1.0, "chat_template": True,
                   "episode": {"tools": [f"{os.path.dirname(__file__)}/episode_tools.py:add"], "max_turns": 3,
                               "max_tokens": 200}},
        "data": {"path": str(tmp_path / "rows.jsonl")},
        "warm_start": {"steps": 150, "lr": 1e-2, "batch_size": 4},
        "rewards": {"accuracy": {"weight": 1.0}},
        "algorithm": {"group_size": 4, "beta": 0.04},
        "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 4},
        "logging": {"report_to": ["none"], "progress": False}}))
    single = run_cli([sys.executable], recipe, tmp_path / "one", 3)
    double = run_cli([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                      "--master_addr", "127.0.0.1", "--master_port", str(free_port())], recipe, tmp_path / "two", 3)
    assert sum(r.get("policy/tool_calls/add", 0) for r in single) > 0  # episodes with tool turns happened
    for a, b in zip(single, double):
        for key in ("policy/episodes", "policy/episode_turns", "policy/tool_calls/add", "policy/tool_errors",
                    "policy/truncated_episodes", "reward/accuracy", "advantage_std", "loss", "kl"):
            assert a.get(key) == pytest.approx(b.get(key), abs=1e-6), (a["step"], key)
    w1 = load_file(tmp_path / "one" / "checkpoints" / "step-000003" / "model" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "checkpoints" / "step-000003" / "model" / "model.safetensors")
    for name in w1:
        assert torch.allclose(w1[name], w2[name], atol=1e-6), name
