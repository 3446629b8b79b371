"""The zoom demo's data and evaluator (`mmrl demo zoom`): the dot is a pixel or two at the
policy's input size and a quarter of the crop of the zoom call its warm start teaches; the
evaluator counts zooms and zooms on the dot; the demo (slow) raises accuracy and zooms on the dot."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from mmrl.tasks.demos.evaluators import zoom_answers
from mmrl.tasks.demos.synthetic.zoom_patches import zoom_patches
from mmrl.tasks.demos.synthetic.shapes import COLOURS

ARGS = dict(size=448, grid=4, dot=8, input_size=112, zoom_side=4)  # the recipe's


def _call_box(call: str) -> list[int]:
    return json.loads(re.fullmatch(r"<tool_call>(.*)</tool_call>", call).group(1))["arguments"]["bbox_2d"]


def test_the_dot_is_two_input_pixels_and_whole_in_the_taught_crop():
    data = zoom_patches(n_train=6, n_eval=4, seed=1, **ARGS)
    question, answer_turn = data["train"][0], data["train"][1]
    image = question["images"][0]
    colour = np.array(COLOURS[question["answer"]])
    # at the input size, no pixel keeps the dot's colour within 40 levels
    small = np.asarray(image.resize((112, 112), Image.BICUBIC)).astype(int)
    assert (np.abs(small - colour).max(axis=2) < 40).sum() <= 4
    # the taught call's box (input frame, x4 to the image) holds the dot, and so does the crop
    box = [v * 448 / 112 for v in _call_box(question["target"])]
    dot = question["dot_box"]
    assert box[0] <= dot[0] and box[1] <= dot[1] and box[2] >= dot[2] and box[3] >= dot[3]
    crop = np.asarray(answer_turn["images"][1]).astype(int)
    assert crop.shape == (16, 16, 3) and (np.abs(crop - colour).max(axis=2) == 0)[4:12, 4:12].all()  # a quarter of it
    assert (np.abs(crop - colour).max(axis=2) == 0).sum() == 64
    assert answer_turn["target"] == f"<answer>{question['answer']}</answer>"
    assert answer_turn["prompt"][1]["content"] == question["target"] + "<eos>"
    assert [r["prompt"] for r in data["eval"]] == [question["prompt"]] * 4  # held out: questions only


def test_the_model_reads_the_crop_at_its_input_size_with_the_dot_over_whole_patches():
    """min_pixels = max_pixels: the 16-pixel crop enters the model at 112 x 112, as the canvas does;
    the 8-pixel dot becomes 56 pixels there, the central 2 x 2 of the 4 x 4 merged tokens (28 pixels each)."""
    from mmrl.tasks.demos.tiny_multimodal import qwen25_vl_char
    _, processor = qwen25_vl_char(hidden=16, layers=1, vision_hidden=16, max_pixels=112 * 112, min_pixels=112 * 112)
    question, answer_turn = zoom_patches(n_train=1, n_eval=1, seed=2, **ARGS)["train"]
    grids = processor.image_processor(images=answer_turn["images"], return_tensors="pt")["image_grid_thw"]
    assert grids.tolist() == [[1, 8, 8], [1, 8, 8]]
    crop = np.asarray(answer_turn["images"][1].resize((112, 112), Image.BICUBIC)).astype(int)
    near = np.abs(crop - np.array(COLOURS[question["answer"]])).max(axis=2) < 40
    assert near[30:82, 30:82].all() and near.sum() <= 60 * 60  # at the centre, 56 x 56; its edges blur


def test_zoom_side_outside_the_dot_and_the_cell_is_refused():
    with pytest.raises(ValueError, match="zoom_side=40"):
        zoom_patches(n_train=1, n_eval=1, **{**ARGS, "zoom_side": 40})
    with pytest.raises(ValueError, match="zoom_side=1 "):
        zoom_patches(n_train=1, n_eval=1, **{**ARGS, "zoom_side": 1})


def test_zoom_evaluator_scores_answers_and_counts_zooms_on_the_dot():
    dot = [220, 220, 228, 228]
    on = {"name": "zoom", "arguments": {"bbox_2d": [54, 54, 58, 58]}, "error": None}  # x4: [216, 216, 232, 232] holds the dot
    off = {"name": "zoom", "arguments": {"bbox_2d": [0, 0, 28, 28]}, "error": None}
    failed = {"name": "zoom", "arguments": {"bbox_2d": [54, 54, 58, 58]}, "error": "outside"}
    counts = {}
    scores = zoom_answers().score(
        None, ["<answer>red</answer>", "<answer>red</answer>", "red", "<answer>blue</answer>"],
        answer=["red"] * 4, dot_box=[dot] * 4, scale=[4.0] * 4, tool_calls=[[on], [off, on], [failed], []],
        log_metric=lambda k, v=1.0: counts.__setitem__(k, counts.get(k, 0) + v))
    assert scores == [1.0, 1.0, 0.0, 0.0]
    assert counts == {"episodes": 4, "zoomed": 2, "zoomed_on_dot": 1}  # the first zoom's box counts


@pytest.mark.slow
def test_zoom_demo_raises_held_out_accuracy_and_zooms_on_the_dot(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "mmrl", "demo", "zoom", f"output_dir={tmp_path}",
                           "logging.progress=false"], env=env, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["eval_after"] - s["eval_before"] > 4 * max(s["eval_before_se"], s["eval_after_se"]), s["evaluator"]
    on_dot = [s[f"eval_{when}/zoomed_on_dot"] / s[f"eval_{when}/episodes"] for when in ("before", "after")]
    assert on_dot[1] > on_dot[0]
    assert (tmp_path / "plots" / "samples.png").read_bytes()[:4] == b"\x89PNG"


def test_the_answer_turn_row_is_the_context_an_episode_reaches():
    """The warm start's answer-turn row, rendered by the chat template, is the question's prompt,
    the zoom call with the eos the model samples, and the tool turn the episode appends."""
    from mmrl.tasks.demos.tiny_multimodal import qwen25_vl_char
    from mmrl.tasks.lm.episodes import tool_message, tool_turn_text
    from mmrl.tasks.lm.multimodal import place_media
    from mmrl.tasks.lm.tools import ToolCall
    _, processor = qwen25_vl_char(hidden=16, layers=1, vision_hidden=16)
    question, answer_turn = zoom_patches(n_train=1, n_eval=1, **ARGS)["train"]
    render = processor.apply_chat_template
    first = render(place_media(question["prompt"], [{"type": "image"}]), tokenize=False, add_generation_prompt=True)
    call = ToolCall("zoom", {"bbox_2d": _call_box(question["target"])}, images=[answer_turn["images"][1]])
    episode = first + question["target"] + "<eos>" + tool_turn_text(render, [tool_message(call, True)], "<eos>")
    row = render(place_media(answer_turn["prompt"], [{"type": "image"}] * 2), tokenize=False, add_generation_prompt=True)
    assert row == episode


def test_the_figure_shows_each_episodes_crop_enlarged_and_its_answers(tmp_path, monkeypatch):
    from mmrl.tasks.demos.synthetic import zoom_patches as module
    drawn = {}
    monkeypatch.setattr(module, "plot_sample_grid", lambda panels, captions, out, ncols: drawn.update(p=panels, c=captions))
    question = zoom_patches(n_train=1, n_eval=1, seed=3, **ARGS)["train"][0]
    on_dot = {"name": "zoom", "arguments": {"bbox_2d": _call_box(question["target"])}, "error": None}
    before = {"text": "<tool_call>", "tool_calls": []}
    after = {"text": f"<answer>{question['answer']}</answer>", "tool_calls": [on_dot]}
    module.draw_episodes([question], [before], [after], tmp_path / "samples.png")
    assert drawn["c"] == [f"dot {question['answer']}; before -, after {question['answer']}"]
    panel = np.asarray(drawn["p"][0]).astype(int)
    # the 16-pixel crop enlarged to 80 (5 x): the dot is its middle 40 pixels, in the "after" slot
    assert (np.abs(panel[60:100, 162 + 84 + 20:162 + 84 + 60] - COLOURS[question["answer"]]).max(axis=2) == 0).all()
    assert (panel[40:120, 162:242] == 255).all()  # no zoom before RL: the slot stays empty
