"""Format reward: the completion has the expected tag structure."""

from __future__ import annotations

import re

from mmrl.reward_registry import register_reward

from .text import completion_text

THINK_ANSWER = r"<think>.*?</think>\s*<answer>.*?</answer>"
ANSWER_ONLY = r"(?:<think>.*?</think>\s*)?<answer>.*?</answer>"


@register_reward("format")
def format_reward(prompts, completions, pattern: str | None = None, think: bool = True, **kwargs) -> list[float]:
    """1 if the stripped completion fully matches `pattern` (default: <think>..</think> then
    <answer>..</answer>, the think block optional when think=False), else 0 (DeepSeek-R1)."""
    regex = re.compile(pattern or (THINK_ANSWER if think else ANSWER_ONLY), flags=re.DOTALL)
    return [1.0 if regex.fullmatch(completion_text(c).strip()) else 0.0 for c in completions]
