"""Format reward: the completion has the expected tag structure."""

from __future__ import annotations

import re

from mmrl.reward_registry import register_reward

from .text import completion_text

# Tag contents may not themselves open or close the same tag, so "<answer>1</answer> x
# <answer>2</answer>" (text outside the tags) does not match.
_THINK = r"<think>(?:(?!</?think>).)*</think>"
_ANSWER = r"<answer>(?:(?!</?answer>).)*</answer>"
THINK_ANSWER = rf"{_THINK}\s*{_ANSWER}"
ANSWER_ONLY = rf"(?:{_THINK}\s*)?{_ANSWER}"


@register_reward("format")
def format_reward(prompts, completions, pattern: str | None = None, think: bool = True, **kwargs) -> list[float]:
    """1.0 if the stripped completion fully matches the shape, else 0.0 (DeepSeek-R1 format reward).

    Default shape: ``<think>...</think>`` then ``<answer>...</answer>``, only whitespace outside the
    tags; the think block is optional when ``think=False``. A custom ``pattern`` (regex,
    ``re.fullmatch`` with DOTALL on the stripped text) replaces the default.
    """
    regex = re.compile(pattern if pattern is not None else (THINK_ANSWER if think else ANSWER_ONLY),
                       flags=re.DOTALL)
    return [1.0 if regex.fullmatch(completion_text(c).strip()) else 0.0 for c in completions]
