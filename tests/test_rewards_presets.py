"""`accuracy` / `format` presets against the authors' rules, written out here case by case
(Video-R1 src/r1-v/src/open_r1/grpo.py, R1-AQA src/utils/rewards.py, VLM-R1
src/open-r1-multimodal/src/open_r1/grpo_jsonl.py)."""

import re
from concurrent.futures import ThreadPoolExecutor

import mmrl.rewards  # noqa: F401  (registration)
import pytest
from mmrl.rewards.reasoner_presets import extract_choice, levenshtein_ratio, word_error_rate

from mmrl.core.scoring import get_reward

accuracy, fmt = get_reward("accuracy"), get_reward("format")


def acc(preset, pairs, **kw):
    completions, answers = zip(*pairs)
    return accuracy([""] * len(pairs), list(completions), answer=list(answers), preset=preset, **kw)


def test_video_r1_multiple_choice_is_exact_and_reads_the_first_block():
    pairs = [("<think>x</think><answer>B</answer>", "B"), ("<answer>(B)</answer>", "B"), ("<answer>b</answer>", "B"),
             ("<answer>B. text</answer>", "B"), ("<answer> B </answer>", "B"),
             ("<answer>A</answer> then <answer>B</answer>", "B"),  # first block: A
             ("<answer>B</answer> then <answer>A</answer>", "B"), ("B", "B"),  # no block: ""
             ("<answer>B</answer>", "<answer>B</answer>")]  # a tagged solution, as their data has
    assert acc("video_r1", pairs, problem_type="multiple choice") == [1, 0, 0, 0, 1, 0, 1, 0, 1]
    # mmrl's default reads the last block and normalises choice letters
    assert accuracy([""] * 3, [p[0] for p in pairs[1:4]], answer=["B"] * 3) == [1.0, 1.0, 1.0]


def test_video_r1_numerical_regression_ocr():
    pairs = [("<answer>3.0</answer>", "3"), ("<answer>3</answer>", "3"), ("<answer>3.14159</answer>", "3.14"),
             ("<answer>3.146</answer>", "3.14"), ("<answer>1,234</answer>", "1234"),  # comma counts as decimal
             ("<answer>1,234.0</answer>", "1234.0"), ("<answer>x</answer>", "3")]
    assert acc("video_r1", pairs, problem_type="numerical") == [0, 1, 1, 0, 0, 1, 0]
    out = acc("video_r1", [("<answer>8</answer>", "10"), ("<answer>30</answer>", "10"), ("<answer>?</answer>", "1")],
              problem_type="regression")
    assert out == pytest.approx([1 - (2 + 1e-9) / (10 + 1e-9), 0.0, 0.0])
    out = acc("video_r1", [("<answer>the cat sat</answer>", "the cat sat on"), ("<answer>The Cat</answer>", "the cat")],
              problem_type="OCR")
    assert out == pytest.approx([0.75, 0.0])  # one deletion of 4; case-sensitive: two substitutions
    # per-row problem types; an unknown type is an error naming the row
    out = acc("video_r1", [("<answer>B</answer>", "B"), ("<answer>2.50</answer>", "2.5")],
              problem_type=["multiple choice", "numerical"])
    assert out == [1.0, 1.0]
    with pytest.raises(ValueError, match="row 0 has None"):
        acc("video_r1", [("<answer>B</answer>", "B")])


def test_r1_aqa_whole_completion_without_tag_case_and_space_sensitive():
    pairs = [("<answer>Piano</answer>", "<answer>Piano</answer>"), ("Piano", "<answer>Piano</answer>"),
             ("  Piano \n", "Piano"), ("<answer>piano</answer>", "Piano"),
             ("<answer>grand  piano</answer>", "grand piano"),
             ("<answer>Piano</answer><answer>Drum</answer>", "Drum"),  # first block
             ("<answer>Pi\nano</answer>", "Pi\nano"),  # a block over two lines is not read: the whole text
             ("I think <answer> Piano </answer>", "Piano")]
    assert acc("r1_aqa", pairs) == [1, 1, 1, 0, 0, 0, 0, 1]
    # math_verify first, on the whole completion: 1/2 equals 0.5 (also off the main thread)
    assert acc("r1_aqa", [("<answer>$\\frac{1}{2}$</answer>", "0.5")]) == [1.0]
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(acc, "r1_aqa", [("<answer>$\\frac{1}{2}$</answer>", "0.5")]).result() == [1.0]


def test_vlm_r1_default_rules():
    pairs = [("<answer>A</answer><answer>the answer is B.</answer>", "B"),  # last block, choice heuristic
             ("<answer>12</answer>", "12.0"),  # float equality
             ("<answer>red car</answer>", "Red car."),  # text: Levenshtein ratio of the cleaned texts = 1
             ("<answer>blue car</answer>", "red car"),
             ("<answer>twelve</answer>", "12")]
    expected = [1.0, 1.0, 1.0, levenshtein_ratio("blue car", "red car"), levenshtein_ratio("twelve", "12")]
    assert acc("vlm_r1", pairs) == pytest.approx(expected)
    assert levenshtein_ratio("blue car", "red car") == pytest.approx(2 * 5 / 15)  # LCS "e car"
    out = acc("vlm_r1", [("<answer>Yes, it is.</answer>", "yes"), ("<answer>(C)</answer>", "C"),
                         ("<answer>Red car.</answer>", "red car")], accu_reward_method=["yes_no", "mcq", "all_match"])
    assert out == [1.0, 0.0, 1.0]  # "(C)": C is followed by ")", not a choice for VLM-R1's pattern
    with pytest.raises(ValueError, match="accu_reward_method"):
        acc("vlm_r1", [("a", "a")], accu_reward_method=["od_ap"])


def test_extract_choice_and_helpers():
    assert extract_choice("B") == "B" and extract_choice("the answer is c.") == "C" and extract_choice("cat") is None
    # two candidates: "A," early, "D." late and after "answer": D wins
    assert extract_choice("A, maybe. The answer is D.") == "D"
    assert word_error_rate("a b c d", "a b c") == 0.25 and word_error_rate("", "x") == 1.0


def test_format_presets():
    texts = ["<think>a</think> <answer>1</answer>", " <think>a</think><answer>1</answer>", "<answer>1</answer>",
             "<think>a</think><answer>1</answer> x <answer>2</answer>", "<answer>1</answer>\n"]
    reference = {p: [1.0 if re.fullmatch(pat, t, re.DOTALL) else 0.0 for t in texts]
                 for p, pat in [("video_r1", r"<think>.*?</think>\s*<answer>.*?</answer>"),
                                ("r1_aqa", r"<answer>.*?</answer>")]}
    assert reference == {"video_r1": [1, 0, 0, 1, 0], "r1_aqa": [0, 0, 1, 0, 0]}
    for preset in ("video_r1", "vlm_r1"):
        assert fmt([""] * 5, texts, preset=preset) == reference["video_r1"]
    assert fmt([""] * 5, texts, preset="r1_aqa") == reference["r1_aqa"]
    assert fmt([""] * 5, texts) == [1, 1, 0, 0, 0]  # mmrl's default: stripped, one block per tag


def test_preset_errors_are_named():
    with pytest.raises(ValueError, match="preset='deepseek'"):
        acc("deepseek", [("a", "a")])
    with pytest.raises(ValueError, match="mode"):
        acc("r1_aqa", [("a", "a")], mode="exact")
    with pytest.raises(ValueError, match="pattern"):
        fmt([""], ["a"], preset="r1_aqa", think=False)


def test_video_r1_free_form_rouge():
    pytest.importorskip("rouge_score")
    # "the cat" against "the cat sat": ROUGE-1 F 0.8, ROUGE-2 F 2/3 (1 of 2 bigrams), ROUGE-L F 0.8
    out = acc("video_r1", [("<answer>the cat</answer>", "the cat sat"), ("<answer>a b</answer>", "c d")],
              problem_type="free-form")
    assert out == pytest.approx([(0.8 + 2 / 3 + 0.8) / 3, 0.0])
