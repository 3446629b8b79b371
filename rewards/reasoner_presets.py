"""The accuracy and format rules of three published reasoners' reward code, reproduced for
``accuracy`` / ``format`` with ``preset: video_r1 | r1_aqa | vlm_r1``.

- ``video_r1`` (github.com/tulerfeng/Video-R1, src/r1-v/src/open_r1/grpo.py): the FIRST
  ``<answer>`` block (no block: the empty string), compared by ``problem_type``:
  ``multiple choice`` exact string equality (``(B)``, ``b``, ``B. text`` all miss ``B``);
  ``numerical`` 0 unless both or neither have a decimal point or comma (``3.0`` vs ``3`` is
  wrong), else equal after removing commas and rounding to 2 decimals; ``OCR`` 1 - word-level
  WER, clipped to [0, 1] (case- and punctuation-sensitive); ``free-form`` the mean of ROUGE-1, -2
  and -L F-measures with stemming (needs ``rouge_score``); ``regression`` 1 - min(relative
  error, 1); any other type, or an error, 0. Format: ``<think>.*?</think>\\s*<answer>.*?</answer>``
  on the unstripped completion.
- ``r1_aqa`` (github.com/xiaomi-research/r1-aqa, src/utils/rewards.py): 1 when math_verify
  finds the whole completion equal to the solution; else the first ``<answer>`` block on one line
  (no block: the whole completion), stripped, equal to the ground truth as a string (case- and
  space-sensitive). Format: a bare ``<answer>.*?</answer>``, no think block.
- ``vlm_r1`` (github.com/om-ai-lab/VLM-R1, src/open-r1-multimodal/src/open_r1/grpo_jsonl.py,
  ``default_accuracy_reward``): the LAST ``<answer>`` block (no block: the whole completion);
  1 when math_verify finds it equal; else a ground truth with a digit: float equality of the
  cleaned texts, or their Levenshtein ratio when either is not a number; a ground truth with a
  choice letter: the letters picked by VLM-R1's `extract_choice` heuristic equal; other text:
  the Levenshtein ratio of the cleaned texts (lower-case, final period dropped). Per-row
  ``accu_reward_method`` ``mcq``, ``yes_no`` and ``all_match`` follow its functions of those names.
  Format: as ``video_r1``.

The ground truth is the ``answer`` column; where it holds an ``<answer>`` block (the authors'
``solution`` column does) the block is read as their code reads it.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Callable, Literal, get_args

Preset = Literal["video_r1", "r1_aqa", "vlm_r1"]
PRESETS = get_args(Preset)

FORMAT_PATTERNS = {
    "video_r1": r"<think>.*?</think>\s*<answer>.*?</answer>",
    "r1_aqa": r"<answer>.*?</answer>",
    "vlm_r1": r"<think>.*?</think>\s*<answer>.*?</answer>",
}


def preset_format(preset: str, text: str) -> float:
    """The preset's format reward: ``re.fullmatch`` with DOTALL on the unstripped text."""
    return 1.0 if re.fullmatch(FORMAT_PATTERNS[preset], text, re.DOTALL) else 0.0


def check_preset(name: str, preset: str) -> None:
    if preset not in PRESETS:
        raise ValueError(f"{name}: preset={preset!r} is not one of {', '.join(PRESETS)}")


# -- shared pieces -------------------------------------------------------------------------------

def _math_verify_equal(predicted: str, truth: str) -> bool:
    """math_verify's ``verify(parse(predicted), parse(truth)) > 0`` as the authors call it (the
    predicted side first; its 5 s signal timeouts, which work only in the main thread, are off
    elsewhere); False where it raises."""
    try:
        from math_verify import parse, verify
    except ImportError as e:  # an optional dependency of the presets that need it
        raise ImportError("the r1_aqa and vlm_r1 presets check answers with math_verify as their authors do: "
                          "pip install math-verify") from e
    timeouts = threading.current_thread() is threading.main_thread()
    parse_kw, verify_kw = ({}, {}) if timeouts else ({"parsing_timeout": None}, {"timeout_seconds": None})
    try:
        return float(verify(parse(predicted, **parse_kw), parse(truth, **parse_kw), **verify_kw)) > 0
    except Exception:  # noqa: BLE001  (the authors' code treats any failure as "not equal")
        return False


def levenshtein_ratio(a: str, b: str) -> float:
    """python-Levenshtein's ``ratio``: 1 - indel distance / (len(a) + len(b)) = 2 LCS / (|a| + |b|);
    1.0 for two empty strings."""
    if not a and not b:
        return 1.0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return 2 * prev[-1] / (len(a) + len(b))


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level Levenshtein distance / max(1, reference words), words split on whitespace."""
    r, h = reference.split(), hypothesis.split()
    prev = list(range(len(h) + 1))
    for i, x in enumerate(r, 1):
        cur = [i]
        for j, y in enumerate(h, 1):
            cur.append(prev[j - 1] if x == y else 1 + min(prev[j], cur[j - 1], prev[j - 1]))
        prev = cur
    return prev[-1] / max(1, len(r))


# -- Video-R1 ------------------------------------------------------------------------------------

VIDEO_R1_TYPES = ("multiple choice", "numerical", "OCR", "free-form", "regression")


def _first_answer_video_r1(text: str) -> str:
    m = re.search(r"<answer>\s*(.*?)\s*</answer>", text, re.DOTALL)
    return m.group(1).strip() if m else ""


def _float_or_none(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _rouge_mean(reference: str, hypothesis: str) -> float:
    try:
        from rouge_score import rouge_scorer
    except ImportError as e:
        raise ImportError("preset video_r1 scores free-form answers with ROUGE as Video-R1 does: "
                          "pip install rouge-score") from e
    scores = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True).score(reference, hypothesis)
    return (scores["rouge1"].fmeasure + scores["rouge2"].fmeasure + scores["rougeL"].fmeasure) / 3


def video_r1_accuracy(completion: str, truth: str, problem_type: str) -> float:
    out, gt = _first_answer_video_r1(completion), truth
    if "<answer>" in truth:
        gt = _first_answer_video_r1(truth)
    if problem_type == "multiple choice":
        return 1.0 if out.strip() == gt.strip() else 0.0
    if problem_type == "numerical":
        if ("." in gt or "," in gt) != ("." in out or "," in out):
            return 0.0
        g, o = _float_or_none(gt), _float_or_none(out)
        return 0.0 if g is None or o is None else float(round(g, 2) == round(o, 2))
    if problem_type == "OCR":
        return max(0.0, min(1.0, 1 - word_error_rate(gt, out)))
    if problem_type == "free-form":
        return max(0.0, min(1.0, _rouge_mean(gt, out)))
    if problem_type == "regression":
        g, o = _float_or_none(gt), _float_or_none(out)
        if g is None or o is None:
            return 0.0
        return 1 - min(1.0, max(0.0, (abs(o - g) + 1e-9) / (abs(g) + 1e-9)))
    return 0.0


# -- R1-AQA --------------------------------------------------------------------------------------

def r1_aqa_accuracy(completion: str, truth: str) -> float:
    if _math_verify_equal(completion, truth):
        return 1.0
    sol = re.search(r"<answer>(.*?)</answer>", truth)
    ground_truth = sol.group(1).strip() if sol else truth.strip()
    found = re.search(r"<answer>(.*?)</answer>", completion)
    student = found.group(1).strip() if found else completion.strip()
    return 1.0 if student == ground_truth else 0.0


# -- VLM-R1 --------------------------------------------------------------------------------------

_CHOICE_KEYWORDS = ("答案", "选择", "正确", "是", "对", "answer", "correct", "choose", "select", "right",
                    "认为", "应该", "觉得", "think", "believe", "should")


def extract_choice(text: str) -> str | None:
    """VLM-R1's choice heuristic: upper-case capital letters not preceded by a capital and
    followed by punctuation or the end; of several, the one scoring most on nearby keywords,
    position in the last 30 % and a following period or comma (ties: the first)."""
    text = re.sub(r"\s+", " ", text.upper())
    choices = re.findall(r"(?<![A-Z])([A-Z])(?=[\.\,\?\!\:\;]|$)", text)
    if not choices:
        return None
    if len(choices) == 1:
        return choices[0]
    scores = dict.fromkeys(choices, 0)
    for choice in choices:
        pos = text.find(choice)
        context = text[max(0, pos - 20):min(len(text), pos + 20)]
        scores[choice] += sum(keyword.upper() in context for keyword in _CHOICE_KEYWORDS)
        if pos > len(text) * 0.7:
            scores[choice] += 2
        if pos < len(text) - 1 and text[pos + 1] in "。.!！,，":
            scores[choice] += 1
    return max(scores.items(), key=lambda kv: kv[1])[0]


def clean_text(text: str) -> str:
    """VLM-R1's clean_text: the last answer block if any, newlines to spaces (dropped after a
    space), stripped, final period removed, lower-case."""
    found = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    if found:
        text = found[-1]
    for char in ("\n", "\r"):
        text = re.sub(r"(?<=\s)" + re.escape(char), "", text)
        text = re.sub(r"(?<!\s)" + re.escape(char), " ", text)
    return text.strip().rstrip(".").lower()


def _ground_truth(truth: str) -> str:
    sol = re.search(r"<answer>(.*?)</answer>", truth)
    return sol.group(1).strip() if sol else truth.strip()


def _vlm_r1_default(completion: str, truth: str) -> float:
    ground_truth = _ground_truth(truth)
    found = re.findall(r"<answer>(.*?)</answer>", completion, re.DOTALL)
    student = found[-1].strip() if found else completion.strip()
    if _math_verify_equal(student, ground_truth):
        return 1.0
    if re.search(r"\d", ground_truth):
        try:
            return float(float(clean_text(student)) == float(clean_text(ground_truth)))
        except ValueError:
            return levenshtein_ratio(clean_text(student), clean_text(ground_truth))
    correct = extract_choice(ground_truth)
    if correct:
        picked = extract_choice(student)
        return 1.0 if picked and picked == correct.upper() else 0.0
    return levenshtein_ratio(clean_text(student), clean_text(ground_truth))


def _vlm_r1_mcq(completion: str, truth: str) -> float:
    ground_truth = _ground_truth(truth)
    correct = extract_choice(ground_truth)
    correct = correct.upper() if correct else truth.strip()
    found = re.search(r"<answer>(.*?)</answer>", completion, re.DOTALL)
    picked = extract_choice(found.group(1).strip() if found else completion.strip())
    return 1.0 if picked and picked == correct else 0.0


def _vlm_r1_yes_no(completion: str, truth: str) -> float:
    ground_truth = _ground_truth(truth.lower())
    found = re.search(r"<answer>(.*?)</answer>", completion.lower(), re.DOTALL)
    student = found.group(1).strip() if found else completion.lower().strip()
    yes_no = lambda s: (m.group(1) if (m := re.search(r"(yes|no)", s)) else "")  # noqa: E731
    return 1.0 if yes_no(ground_truth) == yes_no(student) else 0.0


VLM_R1_METHODS: dict[str, Callable[[str, str], float]] = {
    "default": _vlm_r1_default, "mcq": _vlm_r1_mcq, "yes_no": _vlm_r1_yes_no,
    "all_match": lambda c, t: float(clean_text(c) == clean_text(t)),
}


def vlm_r1_accuracy(completion: str, truth: str, method: str | None = None) -> float:
    return VLM_R1_METHODS[method or "default"](completion, truth)


def preset_accuracy(preset: str, completions: list[str], answers: list[Any], problem_type: Any = None,
                    accu_reward_method: Any = None) -> list[float | None]:
    """The preset's accuracy reward per row; None where the answer is None."""
    n = len(completions)

    def per_row(column: Any, name: str) -> list[Any]:
        if column is None or isinstance(column, str):
            return [column] * n
        if len(column) != n:
            raise ValueError(f"accuracy: column {name!r} has {len(column)} values for {n} completions")
        return list(column)

    types, methods = per_row(problem_type, "problem_type"), per_row(accu_reward_method, "accu_reward_method")
    out: list[float | None] = []
    for i, (text, truth) in enumerate(zip(completions, answers)):
        if truth is None:
            out.append(None)
        elif preset == "video_r1":
            if types[i] not in VIDEO_R1_TYPES:
                raise ValueError(f"accuracy: preset 'video_r1' needs a problem_type (column or argument) in "
                                 f"{', '.join(VIDEO_R1_TYPES)}; row {i} has {types[i]!r}")
            out.append(video_r1_accuracy(text, str(truth), types[i]))
        elif preset == "r1_aqa":
            out.append(r1_aqa_accuracy(text, str(truth)))
        else:
            if methods[i] not in (None, *VLM_R1_METHODS):
                raise ValueError(f"accuracy: preset 'vlm_r1' reproduces accu_reward_method "
                                 f"{', '.join(VLM_R1_METHODS)}; row {i} has {methods[i]!r}")
            out.append(vlm_r1_accuracy(text, str(truth), methods[i]))
    return out
