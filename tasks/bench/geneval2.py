"""GenEval 2 (Kamath et al. 2025, facebookresearch/GenEval2): 800 compositional prompts judged by a
vision-language model (docs/bench.md#geneval-2-geneval2-and-dpg-bench-dpg_bench-a-vision-language-judge), as its ``evaluation.py``:

  vqascore      P(yes) to 'Does this image show "{prompt}"? Answer the question with Yes or No.'
                (the first-token probabilities of Yes, yes, " yes", " Yes", summed)
  soft_tifa_am  the mean over the prompt's questions (``vqa_list``) of P(answer) to
                "{question} Answer in one word.", the answer Yes (its four forms) or, for a
                "How many" question, the number (as written, capitalised, with a space, as a
                digit, a space and the digit)
  soft_tifa_gm  their geometric mean (the headline)
  tifa          the share of questions whose most probable first token, lower-cased, is one of
                the answer's forms

Each figure is 100 x the mean over prompts; per ``atom_count`` (the prompt's atomicity) as
categories. The data (``geneval2_data.jsonl``, CC BY-NC 4.0) is not shipped: ``--data`` a copy.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from mmrl.core.benchmark import Benchmark, Figure
from mmrl.core.scoring import register_reward
from mmrl.rewards.outputs import IMAGE
from mmrl.registry import BENCHMARKS

from .vqa_judge import ask

METHODS = ("vqascore", "soft_tifa_am", "soft_tifa_gm", "tifa")
YES = ("Yes", "yes", " yes", " Yes")
NUMBERS = {"one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7", "eight": "8",
           "nine": "9", "ten": "10"}


def answer_forms(question: str, answer: str) -> list[str]:
    """The answers whose probabilities count for a question (the module docstring)."""
    if not question.startswith("How many"):
        return list(YES)
    digit = NUMBERS.get(answer, "other")
    return [answer, answer.capitalize(), " " + answer, " " + answer.capitalize(), digit, " " + digit]


def prompt_score(method: str, judge: tuple[str, Any], image: Any, prompt: str, vqa_list: Sequence[Sequence[str]]) -> float:
    """One image's score by `method` (module docstring), in [0, 1]."""
    if method == "vqascore":
        return ask(*judge, image, f'Does this image show "{prompt}"? Answer the question with Yes or No.', YES)[1]
    asked = [(answer_forms(q, a), ask(*judge, image, f"{q} Answer in one word.", answer_forms(q, a))) for q, a in vqa_list]
    if method == "tifa":
        return sum(top.lower() in forms for forms, (top, _) in asked) / len(asked)
    probs = [p for _, (_, p) in asked]
    if method == "soft_tifa_am":
        return sum(probs) / len(probs)
    return 0.0 if min(probs) <= 0 else math.exp(sum(math.log(p) for p in probs) / len(probs))


@register_reward("geneval2", outputs=IMAGE)
def geneval2(prompts, completions, text, vqa_list, judge_path, device, method: str = "soft_tifa_gm") -> list[float]:
    """GenEval 2's `method` score of each image (module docstring); the judge is the option ``judge_path``."""
    if method not in METHODS:
        raise ValueError(f"geneval2: method={method!r} is not one of {', '.join(METHODS)}")
    judge = (judge_path[0], device[0])
    return [prompt_score(method, judge, image, t, q) for image, t, q in zip(completions, text, vqa_list)]


def geneval2_rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    rows = []
    for n, row in enumerate(source):
        pairs = row.get("vqa_list")
        if not isinstance(row.get("prompt"), str) or not pairs or any(len(p) != 2 for p in pairs):
            raise ValueError(f"row {n}: needs a prompt and vqa_list [[question, answer], ...]; got {str(pairs)[:60]!r}")
        rows.append({"id": f"{n:04d}", "text": row["prompt"], "vqa_list": [list(p) for p in pairs],
                     "atom_count": row.get("atom_count")})
    return rows


BENCHMARKS.register("geneval2")(Benchmark(
    name="geneval2", description="GenEval 2 (800 compositional prompts): Soft-TIFA and VQAScore by a VLM judge",
    source="geneval2_data.jsonl", split="test", read_rows=geneval2_rows, prompt=lambda row, options: row["text"],
    scorer="geneval2", metrics={m: {"method": m} for m in METHODS},
    figures={m: Figure(m, scale=100.0) for m in METHODS}, headline="soft_tifa_gm", default_task="diffusion",
    categories=("atom_count",),
    official="GenEval 2's questions, prompts to the judge, answer forms and aggregations (evaluation.py) re-implemented; "
             "its judge is Qwen3-VL-8B-Instruct (judge_path); the data is read from a local copy (--data)",
    greedy=False, samples=1, options={"judge_path": "Qwen/Qwen3-VL-8B-Instruct", "device": None}))
