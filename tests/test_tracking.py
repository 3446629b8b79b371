"""metrics.jsonl, TensorBoard, plots and the progress bar."""

import io
import json
import sys
import types

import numpy as np
import pytest

from mmrl.train.reporting.tracking import Progress, Tracker, plot_rewards, plot_sample_grid, wandb_run_id

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_metrics_tensorboard_and_plot(tmp_path):
    t = Tracker(tmp_path, ["tensorboard"], plot_every=2, config={"a": 1})
    plot = tmp_path / "plots" / "rewards.png"
    t.log(1, {"reward_mean": 0.1, "reward/acc": 0.05, "kl": float("nan"), "clip_frac": np.float32(0.25)})
    assert not plot.exists()
    t.log(2, {"reward_mean": 0.2, "reward/acc": 0.1, "kl": 0.01, "clip_frac": 0.1})
    assert plot.read_bytes()[:8] == PNG_MAGIC  # drawn after plot_every steps, before close
    for step in (3, 4):
        t.log(step, {"reward_mean": step / 10, "kl": float("inf")})
    plot.unlink()
    t.close()
    lines = _lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    assert lines[0] == {"step": 1, "reward_mean": 0.1, "reward/acc": 0.05, "kl": None, "clip_frac": 0.25}
    assert lines[3]["kl"] is None and isinstance(lines[3]["reward_mean"], float)
    assert (tmp_path / "metrics.jsonl").read_text().splitlines()[1].startswith('{"clip_frac"')  # sorted keys
    png = plot.read_bytes()  # redrawn on close
    assert png[:8] == PNG_MAGIC and len(png) > 1000
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("reward_mean")] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert [e.step for e in acc.Scalars("kl")] == [2]  # non-finite values are not sent to TensorBoard
    assert json.loads((tmp_path / "config.json").read_text()) == {"a": 1}


def test_resume_drops_records_after_the_checkpoint(tmp_path):
    t = Tracker(tmp_path, ["none"])
    for step in range(1, 6):
        t.log(step, {"reward_mean": 0.0})
    t.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"reward_mean": 0.0, "st')  # a line cut short by the kill
    t = Tracker(tmp_path, ["none"], resume_step=3)
    assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    t.log(4, {"reward_mean": 1.0})
    t.close()
    assert [(r["step"], r["reward_mean"]) for r in _lines(tmp_path / "metrics.jsonl")] == \
        [(1, 0.0), (2, 0.0), (3, 0.0), (4, 1.0)]
    assert not (tmp_path / "tensorboard").exists()


def test_bad_reporter_missing_wandb_and_disabled_tracker(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="bogus.*tensorboard.*wandb.*none"):
        Tracker(tmp_path / "bad", ["bogus"])
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails as if not installed
    with pytest.raises(ImportError, match="pip install wandb"):
        Tracker(tmp_path / "w", ["wandb"])
    t = Tracker(tmp_path / "off", ["tensorboard"], plot_every=1, config={"a": 1}, resume_step=0, enabled=False)
    t.log(1, {"reward_mean": 1.0})
    t.close()
    assert not (tmp_path / "off").exists() and not (tmp_path / "bad").exists()


def test_plot_rewards_without_rewards_draws_nothing(tmp_path):
    (tmp_path / "m.jsonl").write_text("")
    assert plot_rewards(tmp_path / "m.jsonl", tmp_path / "a.png") is False
    (tmp_path / "m.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    assert plot_rewards(tmp_path / "m.jsonl", tmp_path / "a.png") is False
    assert plot_rewards(tmp_path / "missing.jsonl", tmp_path / "a.png") is False
    assert not (tmp_path / "a.png").exists()


def test_sample_grid_and_progress(tmp_path):
    from PIL import Image
    images = [np.full((8, 8, 3), i * 40, dtype=np.uint8) for i in range(4)] + [Image.new("RGB", (8, 8), "red")]
    plot_sample_grid(images, [f"s{i}" for i in range(5)], tmp_path / "grid.png", ncols=3)
    assert (tmp_path / "grid.png").read_bytes()[:8] == PNG_MAGIC
    p = Progress(3, enabled=False)
    p.update(1, {"reward_mean": 0.5})
    p.close()
    p = Progress(3, initial=1)
    p.bar.fp = io.StringIO()
    p.update(2, {"reward_mean": 0.123456, "kl": 0.01, "clip_frac": 0.0})
    assert p.bar.n == 2 and p.bar.postfix == "reward=0.123, kl=0.01, clip=0"
    p.update(3, {"reward_mean": 0.5, "kl": 0.0, "distill_divergence": 0.0421})  # a distillation run
    assert p.bar.postfix == "reward=0.5, kl=0, distill=0.0421"
    p.close()


def test_a_resumed_run_keeps_its_wandb_run_id_and_a_new_run_gets_another(tmp_path):
    first = wandb_run_id(tmp_path, resumed=False)
    assert (tmp_path / "wandb" / "mmrl-run-id").read_text() == first
    assert wandb_run_id(tmp_path, resumed=True) == first
    second = wandb_run_id(tmp_path, resumed=False)  # a new run in the directory (overwrite=true)
    assert second != first and wandb_run_id(tmp_path, resumed=True) == second
    assert wandb_run_id(tmp_path / "never-had-wandb", resumed=True) == \
        (tmp_path / "never-had-wandb" / "wandb" / "mmrl-run-id").read_text()


def test_wandb_gets_the_project_the_name_and_the_run_to_continue(tmp_path, monkeypatch):
    """wandb is not installed here: a stand-in module records what the Tracker asks of it."""
    calls = []

    class Run:
        def log(self, metrics, step):
            pass

        def finish(self):
            pass

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: calls.append(kw) or Run()))
    run_dir = tmp_path / "my-run"
    Tracker(run_dir, ["wandb"], config={"a": 1}, wandb_project="proj").close()
    Tracker(run_dir, ["wandb"], config={"a": 1}, wandb_project="proj", run_name="named", resume_step=0).close()
    stored = (run_dir / "wandb" / "mmrl-run-id").read_text()
    assert calls == [
        {"project": "proj", "name": "my-run", "config": {"a": 1}, "dir": str(run_dir), "id": stored, "resume": "allow"},
        {"project": "proj", "name": "named", "config": {"a": 1}, "dir": str(run_dir), "id": stored, "resume": "allow"}]


def test_progress_without_a_bar_prints_every_print_every_steps(capsys):
    p = Progress(4, enabled=False, print_every=2)
    for step in range(1, 5):
        p.update(step, {"reward_mean": step / 3, "kl": 0.5, "loss": -1.0})
    p.close()
    assert capsys.readouterr().out == ("train step 2/4: reward=0.667 kl=0.5 loss=-1\n"
                                       "train step 4/4: reward=1.33 kl=0.5 loss=-1\n")
    Progress(4, enabled=False).update(4, {"reward_mean": 1.0})  # print_every 0: silent
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("share, draws_while_logging", [(0.01, 1), (1.0, 30)])
def test_plot_redraws_keep_within_their_share_of_the_run_time(tmp_path, monkeypatch, share, draws_while_logging):
    """30 steps logged back to back with plot_every=1: under the 1% budget only the first redraws
    (the next would have to wait ~99 redraw-times); with the whole run's time allowed, every one.
    The real plot is drawn each time; only the number of draws is counted."""
    import mmrl.train.reporting.tracking as tracking
    draws = []

    def counted(*args):
        draws.append(1)
        return plot_rewards(*args)

    monkeypatch.setattr(tracking, "plot_rewards", counted)
    monkeypatch.setattr(tracking, "PLOT_TIME_SHARE", share)
    tracker = Tracker(tmp_path, report_to=["none"], plot_every=1)
    for step in range(1, 31):
        tracker.log(step, {"reward_mean": step / 30})
    assert len(draws) == draws_while_logging
    tracker.close()  # the last plot is always drawn
    assert len(draws) == draws_while_logging + 1 and (tmp_path / "plots" / "rewards.png").is_file()
