"""What a diffusion LM's rollouts are, declared before any model loads (the recipe's checks ask the
adapter class): text completions, each with its `completion_ids` column. Both families' policies
(`DLMPolicy`, `DiffusionGemmaPolicy`) declare it through this mixin."""

from __future__ import annotations

from typing import Any


class TextRollouts:
    @classmethod
    def output_kind(cls, cfg: Any) -> str:
        return "text"

    @classmethod
    def rollout_columns(cls, cfg: Any) -> tuple[str, ...]:
        return ("completion_ids",)
