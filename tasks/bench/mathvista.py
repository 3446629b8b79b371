"""MathVista testmini: mathematical reasoning on images (docs/bench.md#mathvista).

The prompt is the data set's own ``query`` (MathVista's question with its hint and choices). The
answer is read by MathVista's rules (lupantech/MathVista ``evaluation/extract_answer.py`` and
``calculate_score.py``, as lmms-eval's ``mathvista`` task runs them): the response itself when it
is one of the choices, an integer or a float as the answer type asks; ``The answer is "X".``. Where
the official code then asks GPT to extract the answer, this scorer reads, in order, the text in
``<answer>...</answer>``, for numeric answers the last number, else the response. Then MathVista's
normalisation: a multiple-choice extraction becomes its option (a letter, ``(A)``, or the option
nearest by Levenshtein distance), integers and floats are rounded as the problem's precision says;
the normalised answer must equal the reference as a string. Accuracy overall, per task and per
question type.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

from rapidfuzz.distance import Levenshtein

from mmrl.core.benchmark import Benchmark, Figure
from mmrl.core.scoring import register_reward
from mmrl.rewards.outputs import TEXT
from mmrl.registry import BENCHMARKS
from mmrl.rewards.text import completion_text, extract_answer

_LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def rule_extraction(response: str, question_type: str, answer_type: str, choices: Sequence[str] | None) -> str:
    """MathVista's extraction without its GPT step (the module docstring)."""
    if not response:
        return ""
    if question_type == "multi_choice" and choices and response in choices:
        return response
    for kind, cast in (("integer", int), ("float", float)):
        if answer_type == kind:
            try:
                return str(cast(response))
            except ValueError:
                pass
    quick = re.search(r'The answer is "(.*)"\.', response)
    if quick:
        return quick.group(1)
    tagged = extract_answer(response)
    if tagged is not None:
        return tagged
    numbers = _LAST_NUMBER.findall(response) if answer_type in ("integer", "float") else []
    return numbers[-1] if numbers else response.strip()


def normalized_answer(extraction: Any, choices: Sequence[str] | None, question_type: str, answer_type: str,
                      precision: int) -> str | None:
    """MathVista's `normalize_extracted_answer`."""
    if question_type == "multi_choice":
        text = extraction.strip() if isinstance(extraction, str) else str(extraction)
        letter = re.findall(r"\(([a-zA-Z])\)", text)
        text = letter[0].upper() if letter else text
        letters = [chr(ord("A") + i) for i in range(len(choices))]
        if text in letters:
            return choices[letters.index(text)]
        distances = [Levenshtein.distance(text, c) for c in choices]
        return choices[distances.index(min(distances))]
    try:
        if answer_type == "integer":
            return str(int(float(extraction)))
        if answer_type == "float":
            return str(round(float(extraction), precision))
    except (TypeError, ValueError):
        return None
    return str(extraction) if answer_type == "list" else extraction


@register_reward("mathvista_answer", outputs=TEXT)
def mathvista_answer(prompts, completions, answer, choices, question_type, answer_type, precision) -> list[float]:
    """1.0 when the extracted, normalised answer equals ``answer`` as a string."""
    out = []
    for c, gold, opts, qtype, atype, prec in zip(completions, answer, choices, question_type, answer_type, precision):
        extraction = rule_extraction(completion_text(c).strip(), qtype, atype, opts)
        prediction = normalized_answer(extraction, opts, qtype, atype, int(prec) if prec is not None else 0)
        out.append(float(str(prediction).strip() == str(gold).strip()))
    return out


def _precision(value: Any) -> int | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def _rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    rows = []
    for n, row in enumerate(source):
        meta = row.get("metadata") or {}
        rows.append({"id": str(row.get("pid", n)), "query": row["query"], "image": row.get("decoded_image") or row["image"],
                     "answer": row["answer"], "choices": list(row["choices"]) if row.get("choices") else None,
                     "question_type": row["question_type"], "answer_type": row["answer_type"],
                     "precision": _precision(row.get("precision")), "task": meta.get("task")})
    return rows


BENCHMARKS.register("mathvista")(Benchmark(
    name="mathvista", description="MathVista testmini (1000 visual maths questions): accuracy",
    source="AI4Math/MathVista", split="testmini", read_rows=_rows, prompt=lambda row, options: row["query"],
    scorer="mathvista_answer", metrics={"correct": {}}, figures={"accuracy": Figure("correct", scale=100.0)},
    headline="accuracy", default_task="vlm", categories=("task", "question_type"),
    official="MathVista's normalisation and comparison re-implemented (tested against lmms-eval 0.7.3's copy); its "
             "GPT answer extraction is replaced by rules (<answer> tags, the last number), so free-form responses "
             "score lower than the official GPT-extracted figure",
    policy={"vlm": {"max_new_tokens": 512, "image_column": "image"}}))
