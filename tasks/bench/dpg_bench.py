"""DPG-Bench (Hu et al. 2024, ELLA: TencentQQGYLab/ELLA ``dpg_bench/``): 1,065 dense prompts, each
with a graph of yes/no questions (docs/bench.md#geneval-2-geneval2-and-dpg-bench-dpg_bench-a-vision-language-judge), as ``compute_dpg_bench.py``:

An image's questions are each answered yes or no by a VQA judge; then, in the questions' order,
a question with a parent (``dependency``, 0 for none) answered no, or zeroed already, scores 0;
the image's score is the mean over its questions; a prompt's the mean over its 4 images; the
DPG-Bench score 100 x the mean over prompts. Per category (the question's ``tuple`` up to its
"(", its first level before "-": entity, attribute, relation, global, other), the share of the
judge's yes answers before the dependency rule, pooled over questions.

The rows are ELLA's ``dpg_bench.csv`` (``item_id``, ``text``, ``proposition_id``,
``dependency``, ``tuple``, ``question_natural_language``), one row per question, read from a
local copy (``--data``). The judge answers yes when its most probable next token is "yes"
(vqa_judge.py); the official judge is mPLUG-large (modelscope's
``damo/mplug_visual-question-answering_coco_large_en``), which generates the answer.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mmrl.core.benchmark import Benchmark, Figure
from mmrl.core.scoring import register_reward
from mmrl.rewards.outputs import IMAGE
from mmrl.registry import BENCHMARKS

from .vqa_judge import ask

LEVELS = ("entity", "attribute", "relation", "global", "other")


def graph_score(answers: Mapping[int, bool], parents: Mapping[int, Sequence[int]]) -> float:
    """An image's score: yes answers with every parent still standing, over the questions (module docstring)."""
    scores = {q: float(a) for q, a in answers.items()}
    for q, ps in parents.items():
        if any(p != 0 and scores[p] == 0 for p in ps):
            scores[q] = 0.0
    return sum(scores.values()) / len(scores)


def level(tuple_text: str) -> str:
    """A question's first-level category: its tuple's text before "(" and then before "-"."""
    return tuple_text.split("(")[0].strip().split("-")[0].strip()


def _answers(image: Any, questions: Sequence[dict], judge: tuple[str, Any]) -> dict[int, bool]:
    return {q["qid"]: ask(*judge, image, q["question"], ("yes",))[0].strip().lower() == "yes" for q in questions}


@register_reward("dpg_bench", outputs=IMAGE)
def dpg_bench(prompts, completions, questions, judge_path, device, measure: str = "score",
              category: str | None = None) -> list[float | None]:
    """Per image: ``score`` the graph score; ``yes`` / ``asked`` the judge's yes answers / the questions of
    first-level `category` (None where the prompt has none), for the pooled per-category figures."""
    judge, out = (judge_path[0], device[0]), []
    for image, qs in zip(completions, questions):
        answers = _answers(image, qs, judge)
        if measure == "score":
            out.append(graph_score(answers, {q["qid"]: q["parents"] for q in qs}))
            continue
        mine = [q["qid"] for q in qs if q["level"] == category]
        out.append(None if not mine else float(len(mine) if measure == "asked" else sum(answers[q] for q in mine)))
    return out


def dpg_rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    """One row per prompt (ELLA's CSV holds one per question), its questions in the file's order."""
    rows: dict[str, dict] = {}
    for n, line in enumerate(source):
        try:
            qid = int(line["proposition_id"])
            parents = [int(p.strip()) for p in str(line["dependency"]).split(",")]
        except (KeyError, ValueError) as e:
            raise ValueError(f"row {n}: proposition_id / dependency unreadable ({e})") from None
        row = rows.setdefault(str(line["item_id"]), {"id": str(line["item_id"]), "text": line["text"], "questions": []})
        row["questions"].append({"qid": qid, "parents": parents, "question": line["question_natural_language"],
                                 "level": level(str(line["tuple"]))})
    for row in rows.values():
        known = {q["qid"] for q in row["questions"]}
        for q in row["questions"]:
            if any(p != 0 and p not in known for p in q["parents"]):
                raise ValueError(f"prompt {row['id']!r}: question {q['qid']} depends on {q['parents']}, not all its questions")
    return list(rows.values())


METRICS = {"score": {"measure": "score"},
           **{f"{lv}_{m}": {"measure": m, "category": lv} for lv in LEVELS for m in ("yes", "asked")}}
BENCHMARKS.register("dpg_bench")(Benchmark(
    name="dpg_bench", description="DPG-Bench (1,065 dense prompts, 4 images each): a VQA judge on each prompt's "
    "question graph", source="dpg_bench.csv", split="test", read_rows=dpg_rows, prompt=lambda row, options: row["text"],
    scorer="dpg_bench", metrics=METRICS,
    figures={"dpg_score": Figure("score", scale=100.0),
             **{lv: Figure(f"{lv}_yes", per=f"{lv}_asked", scale=100.0) for lv in LEVELS}},
    headline="dpg_score", default_task="diffusion",
    official="DPG-Bench's question graph and aggregation (compute_dpg_bench.py) re-implemented; the official judge is "
             "mPLUG-large (modelscope), here any transformers VLM (judge_path) answering yes by its first token; "
             "the CSV is read from a local copy (--data)",
    greedy=False, samples=4, options={"judge_path": "Qwen/Qwen2.5-VL-7B-Instruct", "device": None}))
