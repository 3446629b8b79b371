"""DeepEyes' reward (Zheng et al. 2025, arXiv:2505.14362), read from the episode.

As DeepEyes' `compute_score` (verl/utils/reward_score/vl_agent.py, `reward 2`):

    0.8 * accuracy + 0.2 * format + 1.2 * (a tool returned an image and accuracy > 0.5)

with `format` 0, or -1 on a format error: `<think>` and `</think>` counted unequally, or
`<answer>` and `</answer>` counted unequally after the last `</think>`, or an answer of 1000
characters or more (which also zeroes the accuracy). The answer is what follows the last
`<answer>` up to the next `</answer>` (the whole text without a tag). The text is the model's
turns joined (`turn_texts`); a tool "was used" when tools returned at least one image into the
episode (DeepEyes counts the `<|vision_start|><|image_pad|>` its tool turns put in the response).
DeepEyes judges accuracy with an LLM (a served Qwen2.5-72B asked whether the answers agree);
here the `accuracy` reward's rule judges it (`mode`: numeric, choice or exact).
"""

from __future__ import annotations

from typing import Any

from mmrl.core.scoring import register_reward

from .accuracy import MODES, Mode, answer_matches, mode_for
from .outputs import TEXT
from .text import completion_text

LONG_ANSWER = 1000  # characters: DeepEyes' guard against answers written to sway the judge


@register_reward("deepeyes", outputs=TEXT)
def deepeyes_reward(prompts, completions, answer, turn_texts=None, tool_calls=None, mode: Mode = "auto",
                    **kwargs) -> list[float | None]:
    """DeepEyes' reward per episode (module docstring); None where the ground truth is None.
    Without episodes (no `turn_texts` / `tool_calls` columns) the completion is the text and no
    tool was used."""
    if mode not in MODES:
        raise ValueError(f"deepeyes: mode={mode!r} is not one of {', '.join(MODES)}")
    n = len(completions)
    if len(answer) != n:
        raise ValueError(f"deepeyes: column 'answer' has {len(answer)} values for {n} completions")
    texts = ["".join(t) for t in turn_texts] if turn_texts is not None else [completion_text(c) for c in completions]
    calls = tool_calls if tool_calls is not None else [[] for _ in range(n)]
    return [None if truth is None else episode_score(text, str(truth), row_calls, mode)
            for text, truth, row_calls in zip(texts, answer, calls)]


def episode_score(text: str, truth: str, calls: list[dict[str, Any]], mode: str) -> float:
    format_error = text.count("<think>") != text.count("</think>")
    after_think = text.split("</think>")[-1].strip()
    format_error |= after_think.count("<answer>") != after_think.count("</answer>")
    answered = text.split("<answer>")[-1].split("</answer>")[0].strip()
    accuracy = float(answer_matches(answered, truth, mode_for(truth) if mode == "auto" else mode))
    if len(answered) >= LONG_ANSWER:
        accuracy, format_error = 0.0, True
    tool_used = sum(call.get("images", 0) for call in calls) > 0
    return 0.8 * accuracy + 0.2 * (-1.0 if format_error else 0.0) + 1.2 * float(tool_used and accuracy > 0.5)
