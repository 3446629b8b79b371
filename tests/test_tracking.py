"""metrics.jsonl, TensorBoard, plots and the progress bar."""

import json

import pytest

from mmrl.tracking import Progress, Tracker, plot_sample_grid


def test_metrics_tensorboard_and_plot(tmp_path):
    t = Tracker(tmp_path, ["tensorboard"], plot_every=2, config={"a": 1})
    for step in range(1, 5):
        t.log(step, {"reward_mean": step / 10, "reward/acc": step / 20, "kl": float("nan"), "clip_frac": 0.1})
    t.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4] and lines[0]["kl"] is None
    png = (tmp_path / "plots" / "rewards.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [round(e.value, 6) for e in acc.Scalars("reward_mean")] == [0.1, 0.2, 0.3, 0.4]
    assert json.loads((tmp_path / "config.json").read_text()) == {"a": 1}


def test_resume_drops_records_after_the_checkpoint(tmp_path):
    t = Tracker(tmp_path, ["none"])
    for step in range(1, 6):
        t.log(step, {"reward_mean": 0.0})
    t.close()
    t = Tracker(tmp_path, ["none"], resume_step=3)
    t.log(4, {"reward_mean": 1.0})
    t.close()
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_bad_reporter_and_disabled_tracker(tmp_path):
    with pytest.raises(ValueError, match="bogus"):
        Tracker(tmp_path, ["bogus"])
    t = Tracker(tmp_path / "off", ["tensorboard"], enabled=False)
    t.log(1, {"reward_mean": 1.0})
    t.close()
    assert not (tmp_path / "off").exists()


def test_sample_grid_and_progress(tmp_path):
    import numpy as np
    images = [np.full((8, 8, 3), i * 40, dtype=np.uint8) for i in range(5)]
    plot_sample_grid(images, [f"s{i}" for i in range(5)], tmp_path / "grid.png", ncols=3)
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    for enabled in (False, True):
        p = Progress(3, enabled=enabled)
        p.update(1, {"reward_mean": 0.5, "kl": 0.01})
        p.close()
