"""A recipe's placed servers under `launch: local` (docs/distributed.md#served-rollouts): the run's main
process starts its rollout and reward servers (`mmrl serve-rollout`, `mmrl serve-reward`), each logging to
OUTPUT_DIR/logs/ROLE-INDEX.log and announcing itself in OUTPUT_DIR/servers/, and stops them with the run;
the run is the synchronous one."""

import json

import pytest
import torch
from helpers import TINY_RECIPE

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer


def run(out, *overrides, steps=2):
    t = Trainer(parse_config(TINY_RECIPE, [f"output_dir={out}", f"max_steps={steps}", *overrides]))
    t.train()
    return t, [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # 60-90 s: three server processes start (torch and the model each) on 2 loaded cores
def test_a_run_starts_its_placed_servers_and_is_the_synchronous_run(tmp_path):
    sync, sync_lines = run(tmp_path / "sync")
    out = tmp_path / "placed"
    placed, placed_lines = run(out, "policy.rollout_engine=hf_server", "placement.rollout=2", "placement.reward=1",
                               "placement.rewards=[accuracy]")
    for a, b in zip(sync_lines, placed_lines, strict=True):
        for key in ("reward/accuracy", "reward/digit_share", "completion_length", "loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
    for (name, p), q in zip(sync.unwrapped.named_parameters(), placed.unwrapped.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert logs == ["reward-accuracy-0.log", "rollout-0.log", "rollout-1.log"]
    assert "serve-rollout: causal_lm tiny:qwen2-char on http://" in (out / "logs" / "rollout-1.log").read_text()
    assert all(process.poll() is not None for process in placed.servers.placed.processes.values())  # stopped with the run
