"""Accuracy reward: the tagged answer against the `answer` column."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from mmrl.reward_registry import register_reward

from .text import completion_text, extract_answer

_CHOICE = re.compile(r"^\(?([A-Za-z])\)?$")
_LETTER = re.compile(r"(?:^|[\s(\[])([A-Z])(?=$|[\s).,:\]])")


def parse_number(text: str) -> float | None:
    """A number from '1,234', '$5', '12%', '3/4', '1e-3'; None when it is not one."""
    s = text.strip().replace(",", "").replace("$", "").rstrip("%").strip()
    if not s:
        return None
    try:
        return float(Fraction(s)) if "/" in s else float(s)
    except (ValueError, ZeroDivisionError):
        return None


def choice_letter(text: str) -> str | None:
    """The first standalone capital letter: 'B', '(B)', 'B.', 'B) text', 'The answer is B'."""
    s = text.strip()
    m = _CHOICE.match(s)
    if m:
        return m.group(1).upper()
    m = _LETTER.search(s)
    return m.group(1) if m else None


def _mode_for(truth: str) -> str:
    if parse_number(truth) is not None:
        return "numeric"
    if _CHOICE.match(truth.strip()):
        return "choice"
    return "exact"


def _normalise(s: str) -> str:
    return " ".join(s.split()).casefold()


@register_reward("accuracy")
def accuracy_reward(prompts, completions, answer, mode: str = "auto", tolerance: float = 1e-6,
                    tag: str = "answer", **kwargs) -> list[float | None]:
    """1 if the <answer> content equals the ground truth (exact, numeric within `tolerance`
    relative and absolute, or multiple-choice letter), 0 otherwise or without the tag;
    None where the ground truth is None."""
    if mode not in ("auto", "exact", "numeric", "choice"):
        raise ValueError(f"accuracy: mode={mode!r} is not one of auto, exact, numeric, choice")
    if len(answer) != len(completions):
        raise ValueError(f"accuracy: column 'answer' has {len(answer)} values for {len(completions)} completions")
    out: list[float | None] = []
    for completion, truth in zip(completions, answer):
        if truth is None:
            out.append(None)
            continue
        truth = str(truth)
        predicted = extract_answer(completion_text(completion), tag)
        if predicted is None:
            out.append(0.0)
            continue
        m = _mode_for(truth) if mode == "auto" else mode
        if m == "numeric":
            p, t = parse_number(predicted), parse_number(truth)
            ok = p is not None and t is not None and math.isclose(p, t, rel_tol=tolerance, abs_tol=tolerance)
        elif m == "choice":
            ok = choice_letter(predicted) == (choice_letter(truth) or "").upper()
        else:
            ok = _normalise(predicted) == _normalise(truth)
        out.append(1.0 if ok else 0.0)
    return out
