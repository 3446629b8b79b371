"""VideoAlign's pairwise accuracy (tasks/bench/pairwise_accuracy.py, scripts/videoalign_accuracy.py)
on hand-counted cases, and the script's scoring of a CSV of video pairs with a model-free video
reward. Both accuracies were also run beside VideoAlign's calc_accuracy.py (docs/bench.md)."""

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from mmrl.tasks.bench.pairwise_accuracy import accuracy_with_ties, accuracy_without_ties

SCRIPT = Path(__file__).parent.parent / "scripts" / "videoalign_accuracy.py"


def test_accuracy_without_ties_leaves_out_human_ties_and_counts_model_ties_as_misses():
    h = [1, 1, -1, 0, -1]
    m = [0.5, -0.2, -1.0, 3.0, 0.0]  # C, D, C, (human tie: out), Tm
    assert accuracy_without_ties(h, m) == pytest.approx(2 / 4)


def test_accuracy_with_ties_picks_the_best_threshold():
    h = [1, 0, -1, 0]
    m = [0.9, 0.1, -0.5, 0.3]
    # e = 0.1: C, Thm, C, Th -> (2 + 1) / 4 = 0.75; e = 0.3: both human ties within -> (2 + 2) / 4 = 1.0
    assert accuracy_with_ties(h, m) == 1.0
    assert accuracy_with_ties([1, -1], [0.2, 0.1]) == 0.5  # every threshold ties the smaller margin at least


def _load_script():
    spec = importlib.util.spec_from_file_location("videoalign_accuracy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mp4(path: Path, frames: np.ndarray) -> str:
    import av
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path.name


def _pairs(tmp_path: Path) -> list[dict]:
    """Two tiny videos (a still one, a flickering one), three labelled pairs of them, written as pairs.csv."""
    rng = np.random.default_rng(0)
    still = np.repeat(rng.integers(0, 255, (1, 32, 32, 3), dtype=np.uint8), 6, axis=0)
    flicker = rng.integers(0, 255, (6, 32, 32, 3), dtype=np.uint8)
    names = {"still": _mp4(tmp_path / "still.mp4", still), "flicker": _mp4(tmp_path / "flicker.mp4", flicker)}
    pairs = [{"path_A": names["still"], "path_B": names["flicker"], "prompt": "a cat", "fps_A": "8", "fps_B": "8", "TA": "A"},
             {"path_A": names["flicker"], "path_B": names["still"], "prompt": "a cat", "fps_A": "8", "fps_B": "8", "TA": "B"},
             {"path_A": names["flicker"], "path_B": names["still"], "prompt": "a cat", "fps_A": "8", "fps_B": "8", "TA": "A"}]
    with open(tmp_path / "pairs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(pairs[0]))
        writer.writeheader()
        writer.writerows(pairs)
    return pairs


def test_the_script_scores_each_video_once_and_compares_the_margins_with_the_labels(tmp_path):
    script, pairs = _load_script(), _pairs(tmp_path)
    scores = script.score_videos(pairs, tmp_path, "temporal_consistency", {"embedding": "pixels"}, None)
    assert set(scores) == {"still.mp4", "flicker.mp4"} and scores["still.mp4"]["TA"] > scores["flicker.mp4"]["TA"]
    got = script.pair_accuracies(pairs, scores)["TA"]
    assert got["pairs"] == 3 and got["without_ties"] == pytest.approx(2 / 3)


def test_the_script_runs_as_a_user_runs_it(tmp_path, monkeypatch, capsys):
    """The script run as __main__ with a user's command line (in this process: a new interpreter would
    only add the plugins' import, ~6 s, to what is tested)."""
    import json
    import runpy
    import sys
    _pairs(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(tmp_path / "pairs.csv"), "--reward", "temporal_consistency",
                                      "--args", '{"embedding": "pixels"}', "--json", str(tmp_path / "out.json")])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    assert json.loads(capsys.readouterr().out) == json.loads((tmp_path / "out.json").read_text())
    got = json.loads((tmp_path / "out.json").read_text())["accuracy"]["TA"]
    assert got["pairs"] == 3 and got["without_ties"] == pytest.approx(2 / 3)
