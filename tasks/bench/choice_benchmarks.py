"""MMMU val and MMAU test-mini: multiple-choice (and MMMU's open) questions on images and on audio
(docs/bench.md#mmmu). The answer parsing is `choices.py`; the prompts, data sources and the
per-discipline / per-task figures follow lmms-eval's ``mmmu_val`` and ``mmau_test_mini`` tasks.

MMMU (lmms-lab/MMMU, validation, 900 questions over 30 subjects in 6 disciplines): the question, its
options as ``A. text`` lines, "Answer with the option's letter from the given choices directly." (open
questions: "Answer the question using a single word or phrase."), the images the question names
(``<image i>``); accuracy overall (every question counts once) and per discipline and subject.
MMAU (lmms-lab-audio/mmau, test_mini, 1000 clips): the question, its choices as ``A. text`` lines and
the same instruction; the chosen letter's text must equal the answer (case and spaces ignored);
accuracy overall and per task (sound, music, speech) and difficulty.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from typing import Any, Mapping, Sequence

from mmrl.core.benchmark import Benchmark, Figure
from mmrl.core.scoring import register_reward
from mmrl.rewards.outputs import TEXT
from mmrl.registry import BENCHMARKS
from mmrl.rewards.text import completion_text

from .choices import choice_letter, letters_for, open_answer_correct

CHOICE_PROMPT = "Answer with the option's letter from the given choices directly."
OPEN_PROMPT = "Answer the question using a single word or phrase."
DISCIPLINES = {
    "Art and Design": ("Art", "Art_Theory", "Design", "Music"),
    "Business": ("Accounting", "Economics", "Finance", "Manage", "Marketing"),
    "Science": ("Biology", "Chemistry", "Geography", "Math", "Physics"),
    "Health and Medicine": ("Basic_Medical_Science", "Clinical_Medicine", "Diagnostics_and_Laboratory_Medicine",
                            "Pharmacy", "Public_Health"),
    "Humanities and Social Science": ("History", "Literature", "Sociology", "Psychology"),
    "Tech and Engineering": ("Agriculture", "Architecture_and_Engineering", "Computer_Science", "Electronics",
                             "Energy_and_Power", "Materials", "Mechanical_Engineering"),
}
DISCIPLINE_OF = {subject: d for d, subjects in DISCIPLINES.items() for subject in subjects}
ACCURACY = {"accuracy": Figure("correct", scale=100.0)}


def sample_key(prompt: Any) -> int:
    """A stable seed from a sample's prompt (the random letter a protocol draws when none is found)."""
    return int.from_bytes(hashlib.blake2b(str(prompt).encode(), digest_size=8).digest(), "little")


def _options(value: Any) -> list[str]:
    return [str(v) for v in (ast.literal_eval(value) if isinstance(value, str) else value)]


@register_reward("mmmu_answer", outputs=TEXT)
def mmmu_answer(prompts, completions, answer, options, question_type) -> list[float]:
    """1.0 when the response's letter (multiple choice) or key phrase (open) matches ``answer`` (MMMU's rules)."""
    out = []
    for prompt, c, gold, opts, kind in zip(prompts, completions, answer, options, question_type):
        text = completion_text(c)
        if kind == "multiple-choice":
            out.append(float(choice_letter(text, letters_for(_options(opts)), sample_key(prompt), "mmmu") == gold))
        else:
            out.append(float(open_answer_correct(text, gold)))
    return out


def _mmmu_rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    rows = []
    for row in source:
        subject = re.sub(r"^[a-z]+_(.+?)_\d+$", r"\1", str(row["id"]))
        question = str(row["question"])
        names = sorted({t.strip("<>").replace(" ", "_") for t in re.findall(r"<image \d+>", question)})
        rows.append({"id": str(row["id"]), "question": question, "options": _options(row["options"]),
                     "answer": row["answer"], "question_type": row["question_type"], "subject": subject,
                     "discipline": DISCIPLINE_OF.get(subject, "unknown"), "image": [row[k] for k in names if row.get(k)]})
    return rows


def _mmmu_prompt(row: dict, options: Mapping[str, Any]) -> str:
    if row["question_type"] == "multiple-choice":
        lines = "\n".join(f"{letter}. {text}" for letter, text in letters_for(row["options"]).items())
        return f"{row['question']}\n{lines}\n\n{options['choice_prompt']}"
    return f"{row['question']}\n\n{options['open_prompt']}"


@register_reward("mmau_answer", outputs=TEXT)
def mmau_answer(prompts, completions, answer, choices) -> list[float]:
    """1.0 when the text of the letter the response chooses (MMAU's parse, A-D) equals ``answer``."""
    out = []
    for prompt, c, gold, options in zip(prompts, completions, answer, choices):
        texts = _options(options)
        letter = choice_letter(completion_text(c), letters_for(texts[:4]), sample_key(prompt), "mmau")
        out.append(float(texts[ord(letter) - ord("A")].strip().lower() == str(gold).strip().lower()))
    return out


def _mmau_rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    return [{"id": str(row.get("id", n)), "question": row["question"], "audio": row["audio"],
             "choices": json.loads(row["choices"]) if isinstance(row["choices"], str) else list(row["choices"]),
             "answer": row["answer"], "task": row.get("task"), "difficulty": row.get("difficulty")}
            for n, row in enumerate(source)]


def _mmau_prompt(row: dict, options: Mapping[str, Any]) -> str:
    lines = "\n".join(f"{letter}. {text}" for letter, text in letters_for(row["choices"]).items())
    return f"{row['question']}\n{lines}{options['choice_prompt']}"


BENCHMARKS.register("mmmu")(Benchmark(
    name="mmmu", description="MMMU validation (900 college-level image questions, 30 subjects): accuracy",
    source="lmms-lab/MMMU", split="validation", read_rows=_mmmu_rows, prompt=_mmmu_prompt, scorer="mmmu_answer",
    metrics={"correct": {}}, figures=ACCURACY, headline="accuracy", default_task="vlm",
    categories=("discipline", "subject"),
    official="MMMU's answer parsing and matching re-implemented (tested against lmms-eval 0.7.3's copy of MMMU's "
             "eval_utils); the no-answer fallback letter is drawn from a seed per sample, not at random",
    policy={"vlm": {"max_new_tokens": 128, "image_column": "image"}},
    options={"choice_prompt": CHOICE_PROMPT, "open_prompt": OPEN_PROMPT}))
BENCHMARKS.register("mmau")(Benchmark(
    name="mmau", description="MMAU test-mini (1000 sound, music and speech clips, multiple choice): accuracy",
    source="lmms-lab-audio/mmau", split="test_mini", read_rows=_mmau_rows, prompt=_mmau_prompt, scorer="mmau_answer",
    metrics={"correct": {}}, figures=ACCURACY, headline="accuracy", default_task="audio_lm",
    categories=("task", "difficulty"),
    official="MMAU's answer parsing (lmms-eval 0.7.3's mmau utils) re-implemented and tested against it; the "
             "no-answer fallback letter is drawn from a seed per sample, not at random",
    policy={"audio_lm": {"max_new_tokens": 128, "audio_column": "audio"}},
    options={"choice_prompt": "\n" + CHOICE_PROMPT}))
