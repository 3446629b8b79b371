"""Built-in rewards on hand-worked examples, and the registry's checks on what rewards return."""

import pytest

from mmrl.reward_registry import RewardError, compute_rewards, register_reward
from rewards import get_reward
from rewards.accuracy import accuracy_reward


def test_format_think_answer():
    fmt = get_reward("format")
    done = fmt(None, ["<think>a</think> <answer>1</answer>", "<answer>1</answer>", "junk <answer>1</answer>", ""])
    assert done == [1.0, 0.0, 0.0, 0.0]
    assert fmt(None, ["<answer>1</answer>", "<think>x</think><answer>2</answer>"], think=False) == [1.0, 1.0]
    assert fmt(None, ["ANSWER: 4"], pattern=r"ANSWER: \d+") == [1.0]


def test_accuracy_modes():
    acc = get_reward("accuracy")
    assert acc is accuracy_reward
    comps = ["<answer>1,234</answer>", "<answer>$5</answer>", "<answer>3/4</answer>", "<answer>12%</answer>",
             "<answer>7</answer>", "no tag 42"]
    assert acc(None, comps, answer=["1234", "5.0", "0.75", "12", "8", "42"]) == [1, 1, 1, 1, 0, 0]
    assert acc(None, ["<answer>The answer is B</answer>", "<answer>(c)</answer>", "<answer>D) cats</answer>"],
               answer=["B", "(C)", "A"]) == [1, 1, 0]
    assert acc(None, ["<answer>  Paris </answer>", "<answer>paris</answer>"], answer=["paris", "Rome"]) == [1, 0]
    assert acc(None, ["<answer>1e-3</answer>", "<answer>0.0011</answer>"], answer=["0.001", "0.001"],
               tolerance=1e-6) == [1, 0]


def test_accuracy_not_applicable_and_length_mismatch():
    acc = get_reward("accuracy")
    assert acc(None, ["<answer>1</answer>"], answer=[None]) == [None]
    with pytest.raises(ValueError, match="'answer' has 1 values for 2"):
        acc(None, ["a", "b"], answer=["1"])


def test_chat_message_completions():
    acc = get_reward("accuracy")
    msg = [{"role": "assistant", "content": "<answer>9</answer>"}]
    assert acc(None, [msg], answer=["9"]) == [1.0]


def test_overlong_shaping_by_hand():
    length = get_reward("length")
    ids = [[0] * n for n in (5, 6, 8, 10, 11)]
    assert length(None, ["x"] * 5, completion_ids=ids, max_length=10, cache_length=4) == \
        pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    assert length(None, ["a b c d"], mode="penalty", max_length=8) == [-0.5]
    with pytest.raises(ValueError, match="cache_length"):
        length(None, ["x"], max_length=4, cache_length=9)


@register_reward("test_nan_reward")
def _nan(prompts, completions, **kw):
    return [0.0, float("nan")]


@register_reward("test_raises")
def _raises(prompts, completions, **kw):
    raise ZeroDivisionError("boom")


def test_compute_rewards_names_broken_rewards():
    with pytest.raises(RewardError, match="test_nan_reward.*sample 1"):
        compute_rewards({"test_nan_reward": _nan}, ["p", "p"], ["a", "b"], {})
    with pytest.raises(RewardError, match="test_raises.*ZeroDivisionError: boom"):
        compute_rewards({"test_raises": _raises}, ["p"], ["a"], {})
    with pytest.raises(RewardError, match="returned 'x'"):
        compute_rewards({"bad": lambda prompts, completions: ["x"]}, ["p"], ["a"], {})
    out = compute_rewards({"fmt": get_reward("format")}, ["p"], ["<answer>1</answer>"], {"answer": ["1"]})
    assert out["fmt"].tolist() == [0.0]
