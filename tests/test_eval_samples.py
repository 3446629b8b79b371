"""Held-out samples at evaluation steps: TensorBoard (read back from its event files) and W&B."""

import io
import sys
import types

import numpy as np
import torch
from mmrl.config.parse import parse_config
from mmrl.core.media import medium
from mmrl.train.loop.trainer import Trainer
from mmrl.train.reporting.eval_samples import log_eval_samples
from mmrl.train.reporting.tracking import Tracker
from PIL import Image

from helpers import TINY_RECIPE, tiny_overrides


def events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0, "audio": 0, "tensors": 0})
    acc.Reload()
    return acc


def text_of(acc, tag):
    return acc.Tensors(tag)[-1].tensor_proto.string_val[0].decode()


def video(colours):
    """[T, 3, 8, 12] float: one flat colour per frame (exact through a GIF palette)."""
    return torch.stack([torch.tensor(c, dtype=torch.float32)[:, None, None].expand(3, 8, 12) / 255 for c in colours])


SAMPLES = [
    {"row": {"prompt": "a red square"}, "completions": [Image.new("RGB", (6, 4), (200, 10, 10)),
                                                         Image.new("RGB", (6, 4), (0, 0, 0))],
     "rewards": [0.75, 0.125], "columns": {}, "greedy": Image.new("RGB", (6, 4), (10, 200, 10)),
     "greedy_reward": 0.5, "greedy_columns": {}},
    {"row": {"prompt": "a moving disc"}, "completions": [video([(255, 0, 0), (0, 0, 255), (0, 255, 0)])],
     "rewards": [float("nan")], "columns": {"fps": [4.0]}, "greedy": [Image.new("RGB", (12, 8), (9, 9, 9))] * 2,
     "greedy_reward": 1.0, "greedy_columns": {"fps": [2.0]}},
    {"row": {"prompt": "say hi"}, "completions": [{"array": np.linspace(-0.5, 0.5, 800), "sampling_rate": 8000}],
     "rewards": [0.25], "columns": {}, "greedy": "hi | there", "greedy_reward": None, "greedy_columns": {}},
]


def test_each_medium_reaches_tensorboard(tmp_path):
    tracker = Tracker(tmp_path, ["tensorboard"], plot_every=0)
    log_eval_samples(tracker, 7, SAMPLES, prompts=3)
    tracker.close()
    acc = events(tmp_path)
    png = acc.Images("samples/0/sample_0")[-1]
    assert png.step == 7
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(png.encoded_image_string))),
                          np.full((4, 6, 3), (200, 10, 10), dtype=np.uint8))
    gif = Image.open(io.BytesIO(acc.Images("samples/1/sample_0")[-1].encoded_image_string))
    frames = []
    for i in range(gif.n_frames):
        gif.seek(i)
        frames.append(tuple(np.asarray(gif.convert("RGB"))[0, 0]))
    assert frames == [(255, 0, 0), (0, 0, 255), (0, 255, 0)] and gif.info["duration"] == 250  # 4 fps
    audio = acc.Audio("samples/2/sample_0")[-1]
    assert audio.sample_rate == 8000 and audio.length_frames == 800
    table = text_of(acc, "samples/0/text_summary")
    assert "**prompt:** a red square" in table and "| greedy | 0.5 | (image) |" in table
    assert "| sample 1 | 0.125 | (image) |" in table
    assert "| sample 0 | None | (video) |" in text_of(acc, "samples/1/text_summary")
    assert "| greedy | None | hi \\| there |" in text_of(acc, "samples/2/text_summary")


def test_media_kinds_and_a_grey_uint8_video():
    grey = torch.full((2, 1, 3, 5), 7, dtype=torch.uint8)
    m = medium(grey, {"fps": 12})
    assert m.kind == "video" and m.rate == 12 and m.data.shape == (2, 3, 5, 3) and (m.data == 7).all()
    assert medium(torch.zeros(10), {}).kind == "audio" and medium(torch.zeros(10), {}).rate == 16000
    assert medium("text", {}).kind == "text" and medium(3, {}).data == "3"


def test_wandb_gets_a_table_of_the_samples(tmp_path, monkeypatch):
    """wandb is not installed here: a stand-in module records what is asked of it (the objects
    wandb would build are not checked)."""
    logged = []

    class Table:
        def __init__(self, columns):
            self.columns, self.rows = columns, []

        def add_data(self, *row):
            self.rows.append(row)

    run = types.SimpleNamespace(log=lambda data, step: logged.append((step, data)), finish=lambda: None)
    stand_in = types.SimpleNamespace(
        init=lambda **kw: run, Table=Table, Image=lambda a: ("Image", a.shape),
        Video=lambda a, fps, format: ("Video", a.shape, fps, format), Audio=lambda a, sample_rate: ("Audio", sample_rate))
    monkeypatch.setitem(sys.modules, "wandb", stand_in)
    tracker = Tracker(tmp_path, ["wandb"], plot_every=0)
    log_eval_samples(tracker, 3, SAMPLES, prompts=2)
    step, data = logged[-1]
    table = data["samples"]
    assert step == 3 and table.columns == ["step", "prompt", "sample", "reward", "completion"]
    assert table.rows[0] == (3, "a red square", "greedy", 0.5, ("Image", (4, 6, 3)))
    assert table.rows[3] == (3, "a moving disc", "greedy", 1.0, ("Video", (2, 3, 8, 12), 2, "gif"))
    assert table.rows[4][4] == ("Video", (3, 3, 8, 12), 4, "gif") and len(table.rows) == 5


def test_a_training_run_logs_its_held_out_samples(tmp_path):
    out = tmp_path / "run"
    cfg = parse_config(TINY_RECIPE, tiny_overrides(out) + ["max_steps=1", "eval.every=1", "eval.max_prompts=2",
                                                          "eval.group_size=2", "eval.log_samples=1",
                                                          "logging.report_to=[tensorboard]"])
    trainer = Trainer(cfg)
    trainer.train()
    acc = events(out)
    assert "samples/0/text_summary" in acc.Tags()["tensors"]
    assert "samples/1/text_summary" not in acc.Tags()["tensors"]
    assert "| greedy |" in text_of(acc, "samples/0/text_summary")
    # only the logged rows' samples are kept (a video's are large); they are the first rows' samples
    every = trainer.evaluate(keep_samples=True)["samples"]
    first = trainer.evaluate(keep_samples=True, kept_rows=1)["samples"]
    assert len(every) == 2 and len(first) == 1
    assert first[0]["completions"] == every[0]["completions"] and first[0]["greedy"] == every[0]["greedy"]


def test_no_samples_when_off(tmp_path):
    tracker = Tracker(tmp_path, ["tensorboard"], plot_every=0)
    log_eval_samples(tracker, 1, SAMPLES, prompts=0)
    tracker.close()
    assert not events(tmp_path).Tags()["tensors"]


SOUNDING = [{"row": {"prompt": "a drum"}, "greedy": {"frames": video([(255, 0, 0), (0, 255, 0)]),
                                                     "array": np.linspace(-0.25, 0.25, 400), "sampling_rate": 400},
             "greedy_reward": 0.5, "greedy_columns": {"fps": [2.0]}, "completions": [], "rewards": [], "columns": {}}]


def test_a_video_with_its_sound_reaches_tensorboard_as_a_gif_and_a_sibling_sound(tmp_path):
    m = medium(SOUNDING[0]["greedy"], {"fps": 2.0})
    assert m.kind == "audio_video" and m.data.shape == (2, 8, 12, 3) and m.rate == 2.0
    assert m.sound.shape == (400,) and m.sound_rate == 400
    tracker = Tracker(tmp_path, ["tensorboard"], plot_every=0)
    log_eval_samples(tracker, 5, SOUNDING, prompts=1)
    tracker.close()
    acc = events(tmp_path)
    gif = Image.open(io.BytesIO(acc.Images("samples/0/greedy")[-1].encoded_image_string))
    assert gif.n_frames == 2 and gif.info["duration"] == 500
    sound = acc.Audio("samples/0/greedy/sound")[-1]
    assert sound.sample_rate == 400 and sound.length_frames == 400
    assert "| greedy | 0.5 | (audio_video) |" in text_of(acc, "samples/0/text_summary")


def test_wandb_gets_the_sound_of_a_video_in_its_own_column(tmp_path, monkeypatch):
    logged = []
    table_of = types.SimpleNamespace  # columns and rows, as the stand-in's Table keeps them
    run = types.SimpleNamespace(log=lambda data, step: logged.append(data), finish=lambda: None)
    stand_in = types.SimpleNamespace(
        init=lambda **kw: run, Image=lambda a: ("Image", a.shape), Video=lambda a, fps, format: ("Video", a.shape, fps),
        Audio=lambda a, sample_rate: ("Audio", len(a), sample_rate),
        Table=lambda columns: table_of(columns=columns, rows=[], add_data=lambda *r: logged.append(r)))
    monkeypatch.setitem(sys.modules, "wandb", stand_in)
    tracker = Tracker(tmp_path, ["wandb"], plot_every=0)
    log_eval_samples(tracker, 3, SOUNDING, prompts=1)
    row, data = logged
    assert data["samples"].columns == ["step", "prompt", "sample", "reward", "completion", "sound"]
    assert row == (3, "a drum", "greedy", 0.5, ("Video", (2, 3, 8, 12), 2), ("Audio", 400, 400))
