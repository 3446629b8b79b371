"""Accuracy reward: the tagged answer against the `answer` column."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal, get_args

from mmrl.core.scoring import register_reward

from .outputs import TEXT
from .reasoner_presets import Preset, check_preset, preset_accuracy
from .text import completion_text, extract_answer

Mode = Literal["auto", "exact", "numeric", "choice"]
MODES = get_args(Mode)

_CHOICE = re.compile(r"^\(?([A-Za-z])\)?$")  # a ground truth that is a choice letter: "B", "(B)"
_LEADING_OPTION = re.compile(r"^(?:\(([A-Za-z])\)|([A-Za-z])(?:[.):]|$))")  # "b", "(b)", "b.", "b) text"
_STANDALONE = re.compile(r"(?<![A-Za-z0-9])([A-Z])(?![A-Za-z0-9'’])")  # "The answer is B"
_NUMBER = re.compile(r"""^(?P<sign1>[+-])?\s*\$?\s*(?P<sign2>[+-])?(?:
      (?P<num>\d+)/(?P<den>\d+)                                  # fraction 3/4
    | (?P<mant>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)       # 1,234.5  12  .5
      (?P<exp>[eE][+-]?\d+)?
    )\s*%?$""", re.VERBOSE)


def _parse(text: str) -> tuple[Fraction, bool] | None:
    """(exact value, is an integer literal) or None. Accepts '1,234', '$5', '-$5', '12%', '3/4',
    '1e-3'; rejects 'nan', 'inf', '1,2', '1_000'."""
    m = _NUMBER.match(text.strip())
    if not m or (m.group("sign1") and m.group("sign2")):
        return None
    negative = "-" in (m.group("sign1") or "", m.group("sign2") or "")
    if m.group("num") is not None:
        if int(m.group("den")) == 0:
            return None
        value, integer = Fraction(int(m.group("num")), int(m.group("den"))), False
    else:
        mant, exp = m.group("mant").replace(",", ""), m.group("exp")
        value = Fraction(mant + (exp or ""))
        integer = "." not in mant and exp is None
    return (-value if negative else value), integer


def parse_number(text: str) -> float | None:
    """A number from '1,234', '$5', '12%', '3/4', '1e-3'; None when it is not one."""
    parsed = _parse(text)
    return None if parsed is None else float(parsed[0])


def numbers_match(predicted: str, truth: str, tolerance: float = 1e-6) -> bool:
    """|p - t| <= max(tolerance * max(|p|, |t|), tolerance) (math.isclose with rel = abs =
    tolerance), exact equality when both are integer literals (a relative tolerance would accept
    12345679 for 12345678). False when either side is not a number."""
    p, t = _parse(predicted), _parse(truth)
    if p is None or t is None:
        return False
    (pv, p_int), (tv, t_int) = p, t
    if p_int and t_int:
        return pv == tv
    tol = Fraction(tolerance)
    return abs(pv - tv) <= max(tol * max(abs(pv), abs(tv)), tol)


def choice_letter(text: str) -> str | None:
    """The chosen option letter, upper-case: 'B', '(b)', 'b.', 'B) text', or the first standalone
    capital letter ('The answer is B'); None when there is none."""
    s = text.strip()
    m = _LEADING_OPTION.match(s)
    if m:
        return (m.group(1) or m.group(2)).upper()
    m = _STANDALONE.search(s)
    return m.group(1) if m else None


def _normalise(s: str) -> str:
    return " ".join(s.split()).casefold()


def mode_for(truth: str) -> str:
    """auto: numeric for a number (but not a digit string with a leading zero, like '0123', which
    is compared exactly), choice for one letter (optionally in parentheses), else exact."""
    if _parse(truth) is not None and not re.match(r"^[+-]?0\d", truth.strip()):
        return "numeric"
    if _CHOICE.match(truth.strip()):
        return "choice"
    return "exact"


@register_reward("accuracy", outputs=TEXT)
def accuracy_reward(prompts, completions, answer, mode: Mode = "auto", tolerance: float = 1e-6,
                    tag: str = "answer", preset: Preset | None = None, problem_type=None, accu_reward_method=None,
                    **kwargs) -> list[float | None]:
    """1.0 if the last ``<tag>`` block's content matches the ground truth, 0.0 if not or when the
    tag is missing, None where the ground truth is None (rule-based reward of DeepSeek-R1, R1-AQA).

    Modes: ``exact`` (whitespace-normalised, case-folded equality); ``numeric``
    (|p - t| <= max(tolerance * max(|p|, |t|), tolerance), integers exactly; '1,234', '$5', '12%',
    '3/4', '1e-3' parse); ``choice`` (option letter, case-insensitive); ``auto`` (numeric for a
    numeric ground truth, choice for a single letter, exact otherwise).

    ``preset``: ``video_r1``, ``r1_aqa`` or ``vlm_r1`` replaces all of this with that paper's own
    rule (see `rewards.reasoner_presets`; `mode`, `tolerance` and `tag` then do not apply).
    ``video_r1`` reads ``problem_type`` (a column, or one value for every row), ``vlm_r1`` an
    optional ``accu_reward_method`` column.
    """
    if len(answer) != len(completions):
        raise ValueError(f"accuracy: column 'answer' has {len(answer)} values for {len(completions)} completions")
    if preset is not None:
        check_preset("accuracy", preset)
        if (mode, tolerance, tag) != ("auto", 1e-6, "answer"):
            raise ValueError(f"accuracy: preset={preset!r} follows its authors' rule; mode / tolerance / tag "
                             "do not apply")
        return preset_accuracy(preset, [completion_text(c) for c in completions], list(answer), problem_type,
                               accu_reward_method)
    if mode not in MODES:
        raise ValueError(f"accuracy: mode={mode!r} is not one of {', '.join(MODES)}")
    if not tolerance >= 0:
        raise ValueError(f"accuracy: tolerance={tolerance!r} must be >= 0")
    out: list[float | None] = []
    for i, (completion, truth) in enumerate(zip(completions, answer)):
        if truth is None:
            out.append(None)
            continue
        truth = str(truth)
        m = mode_for(truth) if mode == "auto" else mode
        if m == "numeric" and _parse(truth) is None:
            raise ValueError(f"accuracy: mode='numeric' but answer[{i}]={truth!r} is not a number")
        if m == "choice" and choice_letter(truth) is None:
            raise ValueError(f"accuracy: mode='choice' but answer[{i}]={truth!r} has no option letter")
        predicted = extract_answer(completion_text(completion), tag)
        out.append(0.0 if predicted is None else float(answer_matches(predicted, truth, m, tolerance)))
    return out


def answer_matches(predicted: str, truth: str, mode: str, tolerance: float = 1e-6) -> bool:
    """Whether the answer `predicted` matches `truth` under `mode` (numeric, choice or exact; as
    `accuracy_reward`, whose `auto` picks the mode from the ground truth: `mode_for`)."""
    if mode == "numeric":
        return numbers_match(predicted, truth, tolerance)
    if mode == "choice":
        return choice_letter(predicted) == choice_letter(truth)
    return _normalise(predicted) == _normalise(truth)
