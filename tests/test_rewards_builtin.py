"""Built-in rewards on hand-worked examples, and the registry's checks on what rewards return."""

import math
import uuid

import pytest
from mmrl.rewards import REWARDS, get_reward
from mmrl.rewards.accuracy import accuracy_reward, choice_letter, parse_number
from mmrl.rewards.format import format_reward
from mmrl.rewards.length import length_reward
from mmrl.rewards.text import completion_text, extract_answer

from mmrl.core.scoring import RewardError, compute_rewards, register_reward


def chat(text):
    return [{"role": "assistant", "content": text}]


# --- registry -----------------------------------------------------------------------------------

def test_builtins_are_registered():
    assert get_reward("accuracy") is accuracy_reward
    assert get_reward("format") is format_reward
    assert get_reward("length") is length_reward
    assert REWARDS.get("length") is length_reward  # (REWARDS.names() would import every plugin: slow)


# --- text helpers ---------------------------------------------------------------------------------

def test_completion_text_and_extract_answer():
    assert completion_text("hi") == "hi"
    assert completion_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    assert completion_text(chat([{"type": "image"}, {"type": "text", "text": "see"}])) == "see"
    assert completion_text(chat(None)) == ""
    with pytest.raises(TypeError):
        completion_text(42)
    assert extract_answer("<answer> 1 </answer> then <answer>\n2\n</answer>") == "2"  # the LAST block
    assert extract_answer("no tags") is None
    assert extract_answer("<answer>unclosed") is None
    assert extract_answer("<box>7</box>", tag="box") == "7"


# --- format ---------------------------------------------------------------------------------------

def test_format_think_answer():
    fmt = get_reward("format")
    comps = ["<think>a\nb</think> <answer>1</answer>", "  <think></think>\n<answer>x</answer>\n",
             "<answer>1</answer>",  # think required by default
             "junk <answer>1</answer>", "<think>a</think><answer>1</answer> trailing",
             "<think>a</think><answer>1</answer> x <answer>2</answer>",  # text between tags
             "", "no tags at all"]
    assert fmt(None, comps) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_format_think_optional_and_custom_pattern():
    fmt = get_reward("format")
    assert fmt(None, ["<answer>1</answer>", "<think>x</think><answer>2</answer>", "<think>x</think>", ""],
               think=False) == [1.0, 1.0, 0.0, 0.0]
    assert fmt(None, ["ANSWER: 4", " ANSWER: 45 \n", "ANSWER: 4 and more"], pattern=r"ANSWER: \d+") == [1.0, 1.0, 0.0]
    assert fmt(None, [chat("<think>t</think><answer>a</answer>"), chat("a")]) == [1.0, 0.0]


# --- accuracy -------------------------------------------------------------------------------------

def test_parse_number():
    assert parse_number("1,234") == 1234
    assert parse_number("1,234,567.5") == 1234567.5
    assert parse_number("$5") == 5 and parse_number("-$5") == -5
    assert parse_number("12%") == 12
    assert parse_number("3/4") == 0.75 and parse_number("-3/4") == -0.75
    assert parse_number("1e-3") == 0.001 and parse_number("2.5E2") == 250
    assert parse_number(".5") == 0.5
    for bad in ("", "abc", "nan", "inf", "1,2", "12,34", "1_000", "3/0", "5 apples", "--5"):
        assert parse_number(bad) is None, bad


def test_accuracy_numeric():
    acc = get_reward("accuracy")
    comps = ["<answer>1,234</answer>", "<answer>$5</answer>", "<answer>3/4</answer>", "<answer>12%</answer>",
             "<answer>7</answer>", "no tag 42", "", "<answer>forty-two</answer>"]
    assert acc(None, comps, answer=["1234", "5.0", "0.75", "12", "8", "42", "42", "42"]) == [1, 1, 1, 1, 0, 0, 0, 0]
    assert acc(None, ["<answer>1e-3</answer>", "<answer>0.0011</answer>", "<answer>0.3333333</answer>"],
               answer=["0.001", "0.001", "1/3"], tolerance=1e-6) == [1, 0, 1]
    # integers compare exactly: a relative tolerance would accept 12345679 for 12345678
    assert acc(None, ["<answer>12345679</answer>", "<answer>12,345,678</answer>"], answer=["12345678"] * 2) == [0, 1]
    assert acc(None, ["<answer>0.5</answer>"], answer=[0.5], mode="numeric") == [1.0]  # non-string column values
    with pytest.raises(ValueError, match=r"answer\[0\]='abc' is not a number"):
        acc(None, ["<answer>1</answer>"], answer=["abc"], mode="numeric")


def test_accuracy_leading_zero_digit_string_is_exact():
    acc = get_reward("accuracy")  # the sorting demo's answers: "0123" is not the number 123
    assert acc(None, ["<answer>123</answer>", "<answer>0123</answer>"], answer=["0123", "0123"]) == [0, 1]


def test_accuracy_choice():
    acc = get_reward("accuracy")
    assert acc(None, ["<answer>The answer is B</answer>", "<answer>(c)</answer>", "<answer>D) cats</answer>",
                      "<answer>b.</answer>", "<answer>B</answer>", "<answer>cats</answer>", "<answer></answer>"],
               answer=["B", "(C)", "A", "B", "b", "A", "A"]) == [1, 1, 0, 1, 1, 0, 0]
    assert acc(None, ["<answer>A</answer>"], answer=["A"], mode="choice") == [1.0]
    assert choice_letter("Answer: (D).") == "D"
    assert choice_letter("nothing here") is None


def test_accuracy_exact():
    acc = get_reward("accuracy")
    assert acc(None, ["<answer>  Paris </answer>", "<answer>paris</answer>", "<answer>New\n  York</answer>"],
               answer=["paris", "Rome", "new york"]) == [1, 0, 1]
    assert acc(None, ["<answer>1.0</answer>"], answer=["1"], mode="exact") == [0.0]
    assert acc(None, ["<final>x</final>", "<answer>x</answer>"], answer=["x", "x"], tag="final") == [1.0, 0.0]


def test_accuracy_not_applicable_and_length_mismatch():
    acc = get_reward("accuracy")
    assert acc(None, ["<answer>1</answer>", "<answer>1</answer>"], answer=[None, "1"]) == [None, 1.0]
    with pytest.raises(ValueError, match="'answer' has 1 values for 2 completions"):
        acc(None, ["a", "b"], answer=["1"])
    with pytest.raises(ValueError, match="mode='fuzzy'"):
        acc(None, ["a"], answer=["1"], mode="fuzzy")


def test_chat_message_completions():
    acc = get_reward("accuracy")
    assert acc(None, [chat("<answer>9</answer>"), chat("9")], answer=["9", "9"]) == [1.0, 0.0]


# --- length ---------------------------------------------------------------------------------------

def test_overlong_shaping_by_hand():
    length = get_reward("length")
    ids = [[0] * n for n in (5, 6, 8, 10, 11)]  # Lmax 10, Lcache 4: shaping starts after 6
    assert length(None, ["x"] * 5, completion_ids=ids, max_length=10, cache_length=4) == \
        pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    words = ["w " * n for n in (6, 7, 11)]  # no ids: whitespace-separated words
    assert length(None, words, max_length=10, cache_length=4) == pytest.approx([0.0, -0.25, -1.0])
    assert length(None, ["a b c"] * 2, completion_ids=[[1] * 9] * 2, unit="words", max_length=10,
                  cache_length=4) == [0.0, 0.0]  # unit=words ignores the ids
    assert length(None, [chat("a b c d e f g h")], max_length=10, cache_length=4) == [-0.5]


def test_length_penalty():
    length = get_reward("length")
    assert length(None, ["a b c d", "", " ".join("x" * 20)], mode="penalty", max_length=8) == [-0.5, 0.0, -1.0]
    assert length(None, ["a b", "a b c d", "a b c d e f"], mode="penalty", max_length=8, target=4) == \
        pytest.approx([-0.25, 0.0, -0.25])


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_length=4, cache_length=9), "cache_length=9"),
    (dict(max_length=4, cache_length=0), "cache_length=0"),
    (dict(max_length=0), "max_length=0"),
    (dict(mode="sigmoid"), "mode='sigmoid'"),
    (dict(unit="chars"), "unit='chars'"),
    (dict(target=3), "target=3"),
    (dict(mode="penalty", max_length=8, target=9), "target=9"),
    (dict(completion_ids=[[1], [2]]), "completion_ids has 2 rows for 1"),
])
def test_length_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        length_reward(None, ["x"], **kwargs)


# --- compute_rewards ------------------------------------------------------------------------------

def _unique(prefix):
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_compute_rewards_rejects_nan_and_wrong_length():
    nan_name, short_name = _unique("test_nan"), _unique("test_short")

    @register_reward(nan_name)
    def nan_reward(prompts, completions, **kw):
        return [0.0, float("nan")]

    @register_reward(short_name)
    def short_reward(prompts, completions, **kw):
        return [1.0]

    with pytest.raises(RewardError, match=f"{nan_name}.*sample 1"):
        compute_rewards({nan_name: get_reward(nan_name)}, ["p", "p"], ["a", "b"], {})
    with pytest.raises(RewardError, match=f"{short_name}.*returned 1 values for 2 completions"):
        compute_rewards({short_name: get_reward(short_name)}, ["p", "p"], ["a", "b"], {})
    with pytest.raises(RewardError, match="'inf_r' returned inf"):
        compute_rewards({"inf_r": lambda prompts, completions: [math.inf]}, ["p"], ["a"], {})


def test_compute_rewards_names_raising_and_non_numeric_rewards():
    def raises(prompts, completions, **kw):
        raise ZeroDivisionError("boom")

    with pytest.raises(RewardError, match="'boom_r' raised ZeroDivisionError: boom"):
        compute_rewards({"boom_r": raises}, ["p"], ["a"], {})
    with pytest.raises(RewardError, match="'bad' returned 'x'"):
        compute_rewards({"bad": lambda prompts, completions: ["x"]}, ["p"], ["a"], {})
    # a builtin's ValueError (column length mismatch) surfaces under the reward's name
    with pytest.raises(RewardError, match="'accuracy' raised ValueError: .*'answer' has 1 values for 2"):
        compute_rewards({"accuracy": get_reward("accuracy")}, ["p", "p"], ["a", "b"], {"answer": ["1"]})


def test_compute_rewards_with_builtins():
    comps = ["<think>t</think><answer>1</answer>", "<answer>2</answer>", "junk"]
    out = compute_rewards({"format": get_reward("format"), "accuracy": get_reward("accuracy")},
                          ["p"] * 3, comps, {"answer": ["1", "2", None]})
    assert out["format"].tolist() == [1.0, 0.0, 0.0]
    acc = out["accuracy"].tolist()
    assert acc[:2] == [1.0, 1.0] and math.isnan(acc[2])  # None -> NaN
