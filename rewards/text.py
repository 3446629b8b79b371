"""Text helpers shared by the text rewards."""

from __future__ import annotations

import re
from typing import Any


def _content_text(content: Any) -> str:
    """A message's content: a string, or the text parts of a multimodal content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, {"type": "image", ...}]
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, a chat message, or the content of the last message of
    a list of chat messages (``[{"role": "assistant", "content": "..."}]``)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        if not completion:
            return ""
        if isinstance(completion[-1], dict):
            return _content_text(completion[-1].get("content"))
    raise TypeError(f"completion {completion!r:.80} is neither text nor a list of chat messages")


def extract_answer(text: str, tag: str = "answer") -> str | None:
    """The content of the last ``<tag>...</tag>`` block, stripped; None when there is none."""
    t = re.escape(tag)
    found = re.findall(rf"<{t}>(.*?)</{t}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None
