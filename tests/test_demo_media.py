"""The audio, video and edit demos end to end (slow: about a minute each, the edit demo about
ten): RL raises the held-out reward and the held-out evaluator beside it; the video model answers
from the frame order (accuracy on shuffled frames stays far below), and the demo reports T-GRPO's
bonus rate; the edit model carries out recolourings and moves."""

import json
import os
import subprocess
import sys

import pytest


def run_demo(tmp_path, demo: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "mmrl", "demo", demo, f"output_dir={tmp_path}",
                           "logging.progress=false"], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (tmp_path / "plots" / "samples.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "samples" / "after" / "samples.json").is_file()
    return summary


@pytest.mark.slow
def test_audio_raises_held_out_accuracy(tmp_path):
    summary = run_demo(tmp_path, "audio")
    assert summary["after"] > summary["before"]  # the training reward
    assert summary["eval_after"] - summary["eval_before"] >= 0.05  # accuracy of the answer letter


@pytest.mark.slow
def test_video_raises_held_out_accuracy_from_the_frame_order(tmp_path):
    """What a user needs to judge T-GRPO: accuracy on ordered and shuffled frames before and
    after, and the bonus rate."""
    summary = run_demo(tmp_path, "video")
    assert summary["after"] > summary["before"]
    assert summary["eval_after"] - summary["eval_before"] >= 0.05
    assert summary["greedy_eval_after"] - summary["greedy_eval_after/shuffled_frames"] >= 0.3
    assert summary["eval_after"] - summary["eval_after/shuffled_frames"] >= 0.2
    groups = summary["after_detail"]["reward/t_grpo/groups"]
    assert 0 < groups and 0 <= summary["after_detail"]["reward/t_grpo/bonus_groups"] <= groups


@pytest.mark.slow  # the whole demo: about 10 min alone on 2 cores (docs/benchmarks.md, "The demos")
def test_edit_demo_carries_out_the_instructions(tmp_path):
    """`mmrl demo edit`: the held-out pair judge (the edit's colour, shape and motion from the
    source all the instruction's) rises by more than four standard errors, the training reward
    with it; the sources, targets and before / after edits are drawn."""
    summary = run_demo(tmp_path, "edit")
    assert summary["after"] > summary["before"]
    gain, se = summary["eval_after"] - summary["eval_before"], max(summary["eval_before_se"], summary["eval_after_se"])
    assert gain > 4 * se, (summary["eval_before"], summary["eval_after"], se)
