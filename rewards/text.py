"""Text helpers shared by the text rewards."""

from __future__ import annotations

import re
from typing import Any


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the content of the last chat message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    raise TypeError(f"completion {completion!r} is neither text nor a list of chat messages")


def extract_answer(text: str, tag: str = "answer") -> str | None:
    """The content of the last <tag>...</tag> block, stripped; None when there is none."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None
