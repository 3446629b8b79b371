"""Format reward: the completion has the expected tag structure."""

from __future__ import annotations

import re

from mmrl.core.scoring import register_reward

from .outputs import TEXT
from .reasoner_presets import Preset, check_preset, preset_format
from .text import completion_text

# Tag contents may not themselves open or close the same tag, so "<answer>1</answer> x
# <answer>2</answer>" (text outside the tags) does not match.
_THINK = r"<think>(?:(?!</?think>).)*</think>"
_ANSWER = r"<answer>(?:(?!</?answer>).)*</answer>"
THINK_ANSWER = rf"{_THINK}\s*{_ANSWER}"
ANSWER_ONLY = rf"(?:{_THINK}\s*)?{_ANSWER}"


@register_reward("format", outputs=TEXT)
def format_reward(prompts, completions, pattern: str | None = None, think: bool = True, preset: Preset | None = None,
                  **kwargs) -> list[float]:
    r"""1.0 if the stripped completion fully matches the shape, else 0.0 (DeepSeek-R1 format reward).

    Default shape: ``<think>...</think>`` then ``<answer>...</answer>``, only whitespace outside the
    tags; the think block is optional when ``think=False``. A custom ``pattern`` (regex,
    ``re.fullmatch`` with DOTALL on the stripped text) replaces the default.

    ``preset``: ``video_r1`` / ``vlm_r1`` (``<think>.*?</think>\s*<answer>.*?</answer>``) or
    ``r1_aqa`` (``<answer>.*?</answer>``), matched as their code does: on the unstripped text,
    tag contents unrestricted (so ``<answer>1</answer> x <answer>2</answer>`` passes).
    """
    if preset is not None:
        check_preset("format", preset)
        if pattern is not None or think is not True:
            raise ValueError(f"format: preset={preset!r} has its authors' pattern; pattern / think do not apply")
        return [preset_format(preset, completion_text(c)) for c in completions]
    regex = re.compile(pattern if pattern is not None else (THINK_ANSWER if think else ANSWER_ONLY),
                       flags=re.DOTALL)
    return [1.0 if regex.fullmatch(completion_text(c).strip()) else 0.0 for c in completions]
