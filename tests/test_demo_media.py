"""The audio and video demos end to end (slow: minutes each): audio's RL raises the held-out
reward and the answer accuracy beside it; the video demo reports ordered and shuffled-frame
accuracy and T-GRPO's bonus rate."""

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
def test_video_demo_reports_ordered_and_shuffled_accuracy(tmp_path):
    """The video demo runs end to end and reports what a user needs to judge T-GRPO: accuracy on
    ordered and shuffled frames before and after, and the bonus rate. (Its tiny model still
    answers at chance, so no rise is asserted: issue 17 stays open on that.)"""
    summary = run_demo(tmp_path, "video")
    for key in ("eval_before", "eval_after", "eval_before/shuffled_frames", "eval_after/shuffled_frames"):
        assert 0.0 <= summary[key] <= 1.0, key
    groups = summary["after_detail"]["reward/t_grpo/groups"]
    assert 0 < groups and 0 <= summary["after_detail"]["reward/t_grpo/bonus_groups"] <= groups
