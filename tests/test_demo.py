"""The embedded demos end to end (slow: minutes each): RL raises the held-out sampled reward and,
beside it, the demo's held-out evaluator (never used as a reward), each by its margin."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("demo,gain,eval_gain", [("text", 0.10, 0.10), ("grounding", 0.03, 0.03), ("asr", 0.03, 0.02),
                                                 ("t2i", 0.05, 0.05), ("dlm", 0.05, 0.05), ("latex", 0.03, 0.02)])
def test_demo_raises_the_held_out_reward_and_evaluator(tmp_path, demo, gain, eval_gain):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "mmrl", "demo", demo, f"output_dir={tmp_path}",
                           "logging.progress=false"], env=env, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) >= {"metric", "before", "after", "greedy_before", "greedy_after"}
    assert summary["after"] - summary["before"] >= gain
    assert summary["after"] - summary["before"] > 4 * max(summary["before_se"], summary["after_se"])
    assert summary["eval_after"] - summary["eval_before"] >= eval_gain, summary["evaluator"]
    assert (tmp_path / "plots" / "rewards.png").is_file()
    if demo in ("grounding", "asr", "t2i", "latex"):  # the demos that draw their held-out samples
        assert (tmp_path / "plots" / "samples.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_t2v_demo_learns_the_stated_motion(tmp_path):
    """`mmrl demo t2v`: the reward (colour_shape over frames + motion_direction) rises by 0.05 and
    the held-out clip judge (colour, shape and direction all right) by more than four standard
    errors; the before / after clips are drawn and written as GIFs."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "mmrl", "demo", "t2v", f"output_dir={tmp_path}",
                           "logging.progress=false"], env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["after"] - summary["before"] >= 0.05
    gain, se = summary["eval_after"] - summary["eval_before"], max(summary["eval_before_se"], summary["eval_after_se"])
    assert gain > 4 * se, (summary["eval_before"], summary["eval_after"], se)
    assert (tmp_path / "plots" / "samples.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "plots" / "samples_00_after.gif").read_bytes()[:3] == b"GIF"
