"""A reward's checks of its column values (`register_reward(..., check_columns=...)`) run in data
validation, before any model loads; the iou reward reads ground-truth boxes written as text
(R1-V / VLM-R1 solutions) and refuses what it cannot read there."""

import copy
import json

import pytest
from helpers import TINY_RECIPE, tiny_overrides
from mmrl.rewards.iou import boxes_problem, iou_reward

from mmrl.config.parse import parse_config
from mmrl.core.scoring import bind_reward, column_checks, compute_rewards
from mmrl.data import DataError
from mmrl.train.loop.trainer import Trainer

R1V_ROWS = [{"problem": f"Where is object {i}? Answer [x1, y1, x2, y2].",
             "solution": "<answer>[38, 53, 71, 86]</answer>"} for i in range(4)]


def r1v_config(tmp_path, rows, *overrides):
    """The tiny causal LM on `rows` (a JSONL file) with the iou reward fed from ``solution``."""
    data = tmp_path / "r1v.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = copy.deepcopy(TINY_RECIPE)
    recipe["data"] = {"path": str(data), "prompt_column": "problem"}
    recipe["rewards"] = {"iou": {"weight": 1.0, "columns": {"boxes": "solution"}}}
    recipe["reward_modules"] = []
    recipe["max_steps"] = 1
    return parse_config(recipe, tiny_overrides(tmp_path / "run") + list(overrides))


def test_boxes_written_as_text_are_read():
    box = [[38, 53, 71, 86]]
    completion = ["<answer>[38, 53, 71, 86]</answer>"]
    for truth in ("[38, 53, 71, 86]", "<answer>[38, 53, 71, 86]</answer>", " <answer> [[38, 53, 71, 86]] </answer>",
                  "<answer>[1, 1, 2, 2]</answer> <answer>[38, 53, 71, 86]</answer>"):  # the last block
        assert iou_reward(None, completion, [truth]) == [1.0], truth
        assert iou_reward(None, completion, [truth]) == iou_reward(None, completion, [box])
    two = "[[0, 0, 10, 10], [20, 20, 30, 30]]"
    assert iou_reward(None, ["[0, 0, 10, 10]"], [two]) == [0.5]
    assert iou_reward(None, ["no box"], ["[]"]) == [1.0]  # no box expected, none given
    for unreadable in ("<answer>a box</answer>", "[1, 2, 3]", "[38, 53, NaN, 86]", "38", "[" * 5000):
        with pytest.raises(ValueError, match=r"column 'boxes' row 0 .*inside <answer>"):
            iou_reward(None, completion, [unreadable])


def test_the_boxes_check_follows_the_preset():
    assert boxes_problem("<answer>[38, 53, 71, 86]</answer>") is None
    assert boxes_problem([[1, 2, 3, 4]]) is None
    assert "write [x1, y1, x2, y2]" in boxes_problem("<answer>a box</answer>")
    assert "write [x1, y1, x2, y2]" in boxes_problem("[1, 2, 3]")
    assert boxes_problem("<answer>[38, 53, 71, 86]</answer>", preset="vlm_r1") is None
    assert "preset vlm_r1" in boxes_problem("<answer>[1, 2]</answer>", preset="vlm_r1")
    rft = "<answer>[{'Position': [1, 2, 3, 4], 'Confidence': 0.9}]</answer>"
    assert boxes_problem(rft, preset="visual_rft") is None
    assert boxes_problem(rft) is not None  # not the default reader's form
    # through the recipe: args and column bindings
    (column, check), = column_checks({"iou": ({"preset": "visual_rft"}, {"boxes": "solution"})})
    assert column == "solution" and check(rft) is None
    assert check("[1, 2]").endswith("(needed by reward 'iou' as 'boxes')")
    assert column_checks({"accuracy": ({}, {})}) == []  # a reward without checks


def test_unreadable_boxes_are_refused_before_the_model_loads(tmp_path):
    no_model = tmp_path / "empty_model_dir"  # exists (the recipe check passes) but holds no model
    no_model.mkdir()
    rows = [*R1V_ROWS[:1], {"problem": "q1", "solution": "<answer>a box</answer>"}, *R1V_ROWS[2:3],
            {"problem": "q3", "solution": "[1, 2, 3]"}]
    with pytest.raises(DataError) as info:
        Trainer(r1v_config(tmp_path, rows, f"policy.model={no_model}"))
    msg = str(info.value)
    data = tmp_path / "r1v.jsonl"
    assert f"{data}: column 'solution': the iou reward cannot read boxes from it: write [x1, y1, x2, y2]" in msg
    assert "(needed by reward 'iou' as 'boxes'): 2 row(s): row 1 ('<answer>a box</answer>'), row 3 ('[1, 2, 3]')" in msg
    # the same recipe with readable rows gets as far as loading the model, and fails there
    with pytest.raises(Exception) as info:
        Trainer(r1v_config(tmp_path, R1V_ROWS, f"policy.model={no_model}"))
    assert not isinstance(info.value, DataError) and "solution" not in str(info.value)


def test_r1v_rows_score_through_the_engine_and_train(tmp_path):
    fns = {"iou": bind_reward("iou", None, {"boxes": "solution"})}
    completions = ["<answer>[38, 53, 71, 86]</answer>", "<answer>[38, 53, 71, 69.5]</answer>", "no box"]
    metrics = {}
    scores = compute_rewards(fns, ["p"] * 3, completions, {"solution": [R1V_ROWS[0]["solution"]] * 3}, metrics)
    assert scores["iou"].tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert metrics == {"reward/iou/unparsable/no_box": 1.0}
    metrics = Trainer(r1v_config(tmp_path, R1V_ROWS)).train_step()
    assert 0.0 <= metrics["reward/iou"] <= 1.0
