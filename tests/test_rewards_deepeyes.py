"""DeepEyes' reward (rewards/deepeyes.py) against hand-computed cases of its rule:
0.8 accuracy + 0.2 format (0 or -1) + 1.2 when a tool returned an image and the answer is right."""

import pytest
from mmrl.rewards import get_reward

ZOOMED = [{"turn": 0, "name": "zoom", "arguments": {"bbox_2d": [0, 0, 9, 9]}, "result": "", "images": 1,
           "error": None}]
FAILED = [{"turn": 0, "name": "zoom", "arguments": {"bbox_2d": [9, 9, 0, 0]}, "result": "", "images": 0,
           "error": "ValueError: bbox_2d=[9, 9, 0, 0] spans less than 4 pixels"}]
CALL = '<think>look closer</think><tool_call>{"name": "zoom"}</tool_call>'


@pytest.mark.parametrize("turns, calls, truth, expected", [
    ([CALL, "<think>it is red</think><answer>Red</answer>"], ZOOMED, "red", 0.8 + 1.2),  # zoomed, right
    (["<think>red</think><answer>red</answer>"], [], "red", 0.8),  # right, no tool
    ([CALL, "<think>blue</think><answer>blue</answer>"], ZOOMED, "red", 0.0),  # zoomed, wrong
    ([CALL, "<answer>red</answer>"], FAILED, "red", 0.8),  # the call failed: no image, no tool bonus
    (["<think>red<answer>red</answer>"], [], "red", 0.8 - 0.2),  # think tags unbalanced
    ([CALL, "</think><answer>red"], ZOOMED, "red", 0.8 - 0.2 + 1.2),  # answer tags unbalanced, answer still read
    (["<think>.</think>red"], [], "red", 0.0),  # no answer tag: the whole text is the answer, think included
    (["red"], [], "red", 0.8),  # ... which a bare answer matches
    (["<think>.</think><answer>3.0</answer>"], [], "3", 0.8),  # numeric ground truth: compared as numbers
    ([CALL, "<answer>" + "red " * 300 + "</answer>"], ZOOMED, "red", -0.2),  # 1000 characters: no accuracy
    ([CALL, "<answer>red</answer>"], ZOOMED, None, None),  # no ground truth: no reward
])
def test_the_deepeyes_reward_follows_their_rule(turns, calls, truth, expected):
    got = get_reward("deepeyes")(["q"], [turns[-1]], answer=[truth], turn_texts=[turns], tool_calls=[calls])
    assert got == [expected] if expected is None else got == [pytest.approx(expected)]


def test_without_episodes_the_completion_is_read_and_no_tool_was_used():
    got = get_reward("deepeyes")(["q", "q"], ["<answer>red</answer>", "<answer>7</answer>"], answer=["red", "8"])
    assert got == [pytest.approx(0.8), 0.0]


def test_a_bad_mode_or_column_is_refused():
    with pytest.raises(ValueError, match="mode='fuzzy'"):
        get_reward("deepeyes")(["q"], ["x"], answer=["x"], mode="fuzzy")
    with pytest.raises(ValueError, match="1 values for 2"):
        get_reward("deepeyes")(["q", "q"], ["x", "y"], answer=["x"])
