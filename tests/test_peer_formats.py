"""The peers' data formats, each from its own file type, train 2 steps with the shipped recipe
unchanged (only data.path and the run size overridden): R1-V / VLM-R1 referring expressions
(JSON, and VLM-R1's conversations JSONL), Visual-RFT detection (save_to_disk with an Image
feature), Video-R1 (JSON with video paths), R1-AQA (JSONL with wav paths), GSM8K (parquet),
Table2LaTeX-style pairs (CSV). Fixtures are generated here, laid out as the peers' files are."""

import json
import math

import av
import numpy as np
import pytest
from PIL import Image

from mmrl.config.parse import load_recipe
from mmrl.core.scoring import score_completions
from mmrl.registry import RECIPES, load_plugins
from mmrl.train.loop.trainer import Trainer

SMALL = ["algorithm.group_size=2", "optim.prompts_per_step=2", "optim.micro_batch_size=4", "max_steps=2",
         "logging.report_to=[none]", "logging.progress=false", "algorithm.beta=0.0"]


def train_two_steps(recipe: str, data_path, tmp_path, *extra, perfect=None, expect=None) -> Trainer:
    """Train 2 steps; then score `perfect(row, columns)` (the right answer written as the model
    should, from the first training row and its rollout columns) with the recipe's rewards and
    check each reaches `expect[name]`: the rewards read the peer's columns as meant."""
    load_plugins()
    cfg = load_recipe(RECIPES.get(recipe), [f"data.path={data_path}", f"output_dir={tmp_path / 'run'}",
                                            *SMALL, *extra])
    trainer = Trainer(cfg)
    metrics = [trainer.train_step() for _ in range(2)]
    for name in cfg.rewards:
        assert all(math.isfinite(m[f"reward/{name}"]) for m in metrics), (name, metrics)
    row = trainer.inputs.train_rows[0]
    rollout = trainer.policy.rollout([row], 1, [0])
    rollout.add_data_columns([row])
    scores = score_completions(trainer.inputs.reward_fns, rollout, [0], [perfect(row, rollout.columns)])
    for name, low in (expect or {}).items():
        assert float(scores[name][0]) >= low, (name, float(scores[name][0]))
    return trainer


def square_image(path, w, h, box):
    im = Image.new("RGB", (w, h), (255, 255, 255))
    im.paste((200, 0, 0), tuple(box))
    im.save(path)


def rec_answer(row, columns):
    """The row's box in the model's input frame (what Qwen2.5-VL sees), as VLM-R1 asks for it."""
    box = json.loads(row["solution"].removeprefix("<answer>").removesuffix("</answer>"))
    (w, h), (iw, ih) = columns["original_size"][0], columns["input_size"][0]
    scaled = [round(box[0] * iw / w), round(box[1] * ih / h), round(box[2] * iw / w), round(box[3] * ih / h)]
    return f"<think>there</think><answer>{json.dumps(scaled)}</answer>"


def test_vlm_r1_referring_expressions_json(tmp_path):
    (tmp_path / "images").mkdir()
    rows = []
    for i in range(4):
        box = [4 * i, 6, 4 * i + 20, 30]
        square_image(tmp_path / "images" / f"{i}.png", 64, 48, box)
        rows.append({"image": f"images/{i}.png", "problem": "the red square",
                     "solution": f"<answer>{json.dumps(box)}</answer>"})
    (tmp_path / "rec_train.json").write_text(json.dumps(rows))
    train_two_steps("vlm_r1_rec", tmp_path / "rec_train.json", tmp_path, perfect=rec_answer,
                    expect={"iou": 0.85, "format": 1.0})


def test_vlm_r1_conversations_jsonl(tmp_path):
    (tmp_path / "coco").mkdir()
    lines = []
    for i in range(4):
        box = [2 * i, 4, 2 * i + 16, 20]
        square_image(tmp_path / "coco" / f"{i}.jpg", 40, 40, box)
        lines.append(json.dumps({"id": i, "image": f"coco/{i}.jpg", "conversations": [
            {"from": "human", "value": "<image>Please provide the bounding box of: the red square"},
            {"from": "gpt", "value": json.dumps(box)}]}))
    (tmp_path / "rec.jsonl").write_text("\n".join(lines))
    train_two_steps("vlm_r1_rec", tmp_path / "rec.jsonl", tmp_path, "data.prompt_column=conversations",
                    "data.answer_from_conversation=true", "data.answer_column=solution", "data.prompt_template=null",
                    perfect=rec_answer, expect={"iou": 0.85, "format": 1.0})


def test_visual_rft_detection_save_to_disk(tmp_path):
    import io

    from datasets import Dataset, DatasetDict, Features, Value
    from datasets import Image as ImageFeature
    images, solutions = [], []
    for i in range(4):
        boxes = [[2, 2, 14, 14], [20 + i, 20, 36, 36]]
        im = Image.new("RGB", (40, 40), (255, 255, 255))
        for b in boxes:
            im.paste((0, 0, 200), tuple(b))
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        images.append({"bytes": buf.getvalue(), "path": None})
        solutions.append("<answer>" + str([{"Position": b, "Confidence": 1} for b in boxes]) + "</answer>")
    features = Features({"image": ImageFeature(), "problem": Value("string"), "solution": Value("string")})
    ds = Dataset.from_dict({"image": images, "problem": ["Detect all blue squares."] * 4, "solution": solutions},
                           features=features)
    DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "visual_rft_data"))
    train_two_steps("visual_rft_detection", tmp_path / "visual_rft_data", tmp_path,
                    perfect=lambda row, _: "<think>t</think>" + row["solution"], expect={"iou": 1.0, "format": 1.0})


def write_clip(path, frames=4, size=32):
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for k in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((size, size, 3), 30 * k, dtype=np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_video_r1_json(tmp_path):
    (tmp_path / "Video-R1-data").mkdir()
    rows = []
    for i in range(4):
        write_clip(tmp_path / "Video-R1-data" / f"{i}.mp4")
        rows.append({"problem_id": i, "problem": "Does it get brighter?", "data_type": "video",
                     "problem_type": "multiple choice", "options": ["A. yes", "B. no"], "process": "",
                     "solution": "<answer>A</answer>", "path": f"./Video-R1-data/{i}.mp4", "data_source": "synthetic"})
    (tmp_path / "video_r1.json").write_text(json.dumps(rows))
    train_two_steps("video_r1", tmp_path / "video_r1.json", tmp_path,
                    perfect=lambda row, _: "<think>t</think><answer>A</answer>", expect={"accuracy": 1.0, "format": 1.0})


def test_r1_aqa_jsonl(tmp_path):
    import soundfile
    (tmp_path / "wav").mkdir()
    lines = []
    for i in range(4):
        t = np.arange(8000) / 16000
        soundfile.write(tmp_path / "wav" / f"{i}.wav", np.sin(2 * np.pi * (300 + 100 * i) * t).astype(np.float32), 16000)
        lines.append(json.dumps({"id": i, "video_name": f"v{i}", "question_text": "What happened in the video?",
                                 "multi_choice": ["a dog barks", "a car passes"], "answer": i % 2,
                                 "dataset_name": "AVQA", "audio_path": f"wav/{i}.wav"}))
    (tmp_path / "avqa_train.jsonl").write_text("\n".join(lines))
    train_two_steps("r1_aqa", tmp_path / "avqa_train.jsonl", tmp_path,
                    perfect=lambda row, _: "<answer>a dog barks</answer>", expect={"accuracy": 1.0, "format": 1.0})


def test_gsm8k_parquet(tmp_path):
    import pandas as pd
    rows = [{"question": f"Tom has {a} apples and buys {b}. How many?",
             "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"} for a, b in
            [(1, 2), (3, 4), (5, 6), (7, 1)]]
    pd.DataFrame(rows).to_parquet(tmp_path / "train-00000-of-00001.parquet")
    train_two_steps("gsm8k", tmp_path / "train-00000-of-00001.parquet", tmp_path, "data.subset=null",
                    "data.split=null", perfect=lambda row, _: "<answer>3</answer>", expect={"accuracy": 1.0})


@pytest.mark.slow  # renders LaTeX with the TeX sandbox (~80 s on 2 cores)
def test_table2latex_csv(tmp_path):
    import pandas as pd
    (tmp_path / "img").mkdir()
    rows = []
    for i in range(4):
        square_image(tmp_path / "img" / f"t{i}.png", 48, 32, [4, 4, 40, 28])
        rows.append({"image": f"img/t{i}.png", "latex": f"\\begin{{tabular}}{{cc}} a & {i} \\\\ \\end{{tabular}}"})
    pd.DataFrame(rows).to_csv(tmp_path / "tables.csv", index=False)
    train_two_steps("table2latex", tmp_path / "tables.csv", tmp_path, perfect=lambda row, _: row["reference"],
                    expect={"latex_render": 0.99})


@pytest.mark.parametrize("name", ["vlm_r1_rec", "visual_rft_detection", "video_r1", "r1_aqa", "gsm8k", "table2latex"])
def test_peer_recipes_are_listed(name):
    load_plugins()
    assert name in RECIPES.names()
