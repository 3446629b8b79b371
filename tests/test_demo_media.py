"""The grounding, video and audio demos end to end (slow: minutes each): RL raises the held-out
reward and the held-out evaluator beside it; grounding's boxes reach IoU 0.3; the video model reads
the frames' order (its accuracy on shuffled frames stays below its accuracy on ordered ones)."""

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
@pytest.mark.xfail(reason="issue 17 item 3 not reached yet: held-out sampled IoU ~0.10 after RL", strict=False)
def test_grounding_boxes_land_on_the_named_shape(tmp_path):
    summary = run_demo(tmp_path, "grounding")
    assert summary["after"] >= 0.3  # held-out sampled IoU
    assert summary["after"] - summary["before"] > 4 * max(summary["before_se"], summary["after_se"])
    assert summary["eval_after"] > summary["eval_before"]  # the fraction of boxes at IoU >= 0.5


@pytest.mark.slow
@pytest.mark.parametrize("demo", [pytest.param("video", marks=pytest.mark.xfail(
    reason="issue 17 item 4 not reached yet: the tiny video model answers at chance", strict=False)), "audio"])
def test_video_and_audio_raise_held_out_accuracy(tmp_path, demo):
    summary = run_demo(tmp_path, demo)
    assert summary["after"] > summary["before"]  # the training reward
    assert summary["eval_after"] - summary["eval_before"] >= 0.05  # accuracy of the answer letter
    if demo == "video":  # the model answers from the frames' order: shuffling them costs accuracy
        assert summary["eval_after/shuffled_frames"] < summary["eval_after"]
        groups = summary["after_detail"]["reward/t_grpo/groups"]
        assert 0 <= summary["after_detail"]["reward/t_grpo/bonus_groups"] <= groups
