"""GSM8K and MATH500, for text LMs and masked diffusion LMs (docs/bench.md#gsm8k).

GSM8K (openai/gsm8k, main, test): lm-eval's ``gsm8k`` task definition. The reference is the worked
solution; the model's answer is read by lm-eval's two filters, ``strict-match`` (the first
``#### N``) and ``flexible-extract`` (the last number-like run, ``(-?[$0-9.,]{2,})|(-?[0-9]+)``),
the completion cut first at the task's stop strings; both sides then pass lm-eval's ``exact_match``
(its ``regexes_to_ignore`` ``,``, ``$``, ``(?s).*#### ``, ``\\.$``, then lower case) and are compared
as strings. flexible-extract is the headline: a zero-shot model seldom writes ``####``. The prompt is
lm-eval's ``Question: {question}\\nAnswer:`` (zero-shot; lm-eval's default is 5-shot).

MATH500 (HuggingFaceH4/MATH-500, test): math-verify's equivalence of the completion's answer
(``math_verify.parse``: the last ``\\boxed{}`` first, then LaTeX or plain expressions) with the
reference answer (``\\boxed{answer}``), per subject and level.

Diffusion LMs (the ``dlm`` adapter) generate with d1's evaluation settings (dllm-reasoning/d1
``eval/eval.py``: generation length 256, blocks of 32, 256 / 2 = 128 steps, temperature 0,
low-confidence remasking, its system prompt and the bare question). Not reproduced from d1: the
``<reasoning>`` it can append to the prompt, and its system prompt sits in the system turn here,
not at the head of the user turn.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from mmrl.core.benchmark import Benchmark, Figure
from mmrl.core.scoring import register_reward
from mmrl.rewards.outputs import TEXT
from mmrl.registry import BENCHMARKS
from mmrl.rewards.text import completion_text

from ..dlm.policy import DLMPolicy

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORED = (",", r"\$", r"(?s).*#### ", r"\.$")  # lm-eval gsm8k's exact_match regexes_to_ignore
UNTIL = ["Question:", "</s>", "<|im_end|>"]
INVALID = "[invalid]"
D1_SYSTEM_PROMPT = ("You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final "
                    "answer in a \\boxed{}. \nRespond in the following format:\n<reasoning>\nYour reasoning here\n"
                    "</reasoning>\n<answer>\n\\boxed{...}\n</answer>")
D1 = {"gen_length": 256, "block_length": 32, "steps": 128, "temperature": 0.0, "remasking": "low_confidence",
      "cfg_scale": 0.0, "system_prompt": D1_SYSTEM_PROMPT}
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def gsm8k_extract(completion: str, filter: str, until: Sequence[str] = UNTIL) -> str:
    """lm-eval's filter `filter` ("strict" or "flexible") on the completion cut at the first stop string."""
    for stop in until:
        completion = completion.split(stop)[0]
    found = (STRICT if filter == "strict" else FLEXIBLE).findall(completion)
    if not found:
        return INVALID
    match = found[0] if filter == "strict" else found[-1]
    if isinstance(match, tuple):
        match = next((m for m in match if m), INVALID)
    return match.strip()


def exact_match_form(text: str) -> str:
    """A string as lm-eval's gsm8k exact_match compares it."""
    for pattern in IGNORED:
        text = re.sub(pattern, "", text)
    return text.lower()


@register_reward("gsm8k_answer", outputs=TEXT)
def gsm8k_answer(prompts, completions, answer, filter: str = "flexible", until: Sequence[str] = UNTIL) -> list[float]:
    """1.0 when the answer `filter` extracts from the completion equals the number after ``####`` in
    the ``answer`` column, as lm-eval's gsm8k exact_match compares them (the module docstring)."""
    if filter not in ("strict", "flexible"):
        raise ValueError(f"gsm8k_answer: filter={filter!r} is not strict or flexible")
    return [float(exact_match_form(gsm8k_extract(completion_text(c), filter, until)) == exact_match_form(a))
            for c, a in zip(completions, answer)]


def _gsm8k_rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    rows = []
    for n, row in enumerate(source):
        if "####" not in str(row.get("answer", "")):
            raise ValueError(f"row {n}: answer {str(row.get('answer'))[:60]!r} has no '#### <number>'")
        rows.append({"id": str(row.get("id", n)), "question": row["question"], "answer": row["answer"]})
    return rows


def _question(template_key: str):
    def prompt(row: dict, options: Mapping[str, Any]) -> str:
        return options["template"].format(**{template_key: row[template_key]})
    return prompt


def _d1_template(options: Mapping[str, Any], policy: Any) -> dict[str, Any]:
    """template "auto": the bare question for a diffusion LM (d1), the protocol's template otherwise."""
    if options["template"] != "auto":
        return dict(options)
    return {**options, "template": options["d1_template"] if isinstance(policy, DLMPolicy) else options["default_template"]}


@register_reward("math_answer", outputs=TEXT)
def math_answer(prompts, completions, answer) -> list[float]:
    """1.0 when math-verify finds the completion's answer equivalent to ``\\boxed{answer}``."""
    from math_verify import parse, verify
    return [float(verify(parse(f"\\boxed{{{a}}}"), parse(completion_text(c)))) for c, a in zip(completions, answer)]


def _math_rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    return [{"id": str(row.get("unique_id", n)), "problem": row["problem"], "answer": str(row["answer"]),
             "subject": row.get("subject"), "level": row.get("level")} for n, row in enumerate(source)]


ACCURACY = {"accuracy": Figure("correct", scale=100.0)}
BENCHMARKS.register("gsm8k")(Benchmark(
    name="gsm8k", description="GSM8K test (1319 grade-school maths word problems): exact match of the final number",
    source="openai/gsm8k", subset="main", split="test", read_rows=_gsm8k_rows, prompt=_question("question"),
    scorer="gsm8k_answer", metrics={"flexible_extract": {"filter": "flexible"}, "strict_match": {"filter": "strict"}},
    figures={"flexible_extract": Figure("flexible_extract", scale=100.0), "strict_match": Figure("strict_match", scale=100.0)},
    headline="flexible_extract", default_task="causal_lm",
    official="lm-eval's gsm8k filters and exact_match re-implemented (tested against lm-eval 0.4.13's RegexFilter and "
             "exact_match_hf_evaluate); zero-shot prompt, not lm-eval's 5-shot; d1's settings for diffusion LMs",
    policy={"causal_lm": {"max_new_tokens": 256, "stop_strings": UNTIL}, "dlm": D1},
    options={"template": "auto", "default_template": "Question: {question}\nAnswer:", "d1_template": "{question}"},
    resolve_options=_d1_template))
BENCHMARKS.register("math500")(Benchmark(
    name="math500", description="MATH-500 (500 competition problems, Lightman et al.'s split): math-verify equivalence",
    source="HuggingFaceH4/MATH-500", split="test", read_rows=_math_rows, prompt=_question("problem"),
    scorer="math_answer", metrics={"correct": {}}, figures=ACCURACY, headline="accuracy", default_task="causal_lm",
    categories=("subject", "level"),
    official="math-verify (the package) decides equivalence; the prompt and the boxed reference are mmrl's",
    policy={"causal_lm": {"max_new_tokens": 2048}, "dlm": D1},
    options={"template": "auto", "default_template": "{problem}\n" + MATH_INSTRUCTION.replace("{}", "{{}}"),
             "d1_template": "{problem}"},
    resolve_options=_d1_template))
