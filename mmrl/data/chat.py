"""Conversations as prompts: OpenAI-style ``messages`` (``role`` / ``content``) or LLaVA-style
``conversations`` (``from`` / ``value``, ``human`` / ``gpt``).

The prompt is the conversation up to its last user turn; earlier turns may include tool calls
(an assistant message's ``tool_calls``, kept for the chat template) and ``tool`` messages, as
in TRL's conversational rows with tools. A conversation that ends with an
assistant turn holds the answer: with ``data.answer_from_conversation`` it becomes the row's
answer column, without it the row is refused (a model trained on such prompts would be shown
the answer). The prompt stays a list of ``{"role", "content"}`` messages, a single user turn
included, so the chat template is applied to it as to any conversation (as TRL does with its
conversational format); only a plain string prompt goes to the model as it is. LLaVA's
``<image>`` / ``<video>`` placeholders stay in the text: the adapters place each where the
model's chat template expects it (see `split_placeholders`).
"""

from __future__ import annotations

import re
from typing import Any

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "bot": "assistant",
         "model": "assistant", "system": "system", "tool": "tool"}
PLACEHOLDERS = {"<image>": "image", "<video>": "video", "<audio>": "audio"}
_PLACEHOLDER = re.compile("|".join(re.escape(p) for p in PLACEHOLDERS))


def is_conversation(value: Any) -> bool:
    """A non-empty list of dicts with ``role``/``content`` (or an assistant's ``tool_calls``) or
    ``from``/``value``."""
    return (isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)
            and all(("role" in m and ("content" in m or "tool_calls" in m)) or ("from" in m and "value" in m)
                    for m in value))


def _message(turn: dict, k: int) -> dict:
    speaker = turn.get("role", turn.get("from"))
    role = ROLES.get(str(speaker).lower())
    if role is None:
        raise ValueError(f"turn {k} has speaker {speaker!r}; expected one of {', '.join(ROLES)}")
    message = {"role": role, "content": turn.get("content", turn.get("value"))}
    if turn.get("tool_calls"):  # an assistant turn that called tools (OpenAI / TRL), for the chat template
        message["tool_calls"] = turn["tool_calls"]
        message["content"] = message["content"] or ""
    return message


def _text(content: Any) -> Any:
    """A message's text: strings as they are, OpenAI content parts joined ({"type": "text"} parts;
    image parts become ``<image>`` placeholders)."""
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                parts.append(part.get("text", ""))
            elif kind in ("image", "video", "audio"):
                parts.append(f"<{kind}>")
        return "".join(parts)
    return content


def split_conversation(value: list, answer_from_conversation: bool, column: str) -> tuple[Any, str | None]:
    """(prompt, answer): the prompt up to the last user turn (the whole conversation when it ends
    with a tool turn) as a message list, the final assistant turn's text or None. Raises ValueError naming
    `column` for a conversation without a user turn, or one that ends with an answer that
    nothing says what to do with."""
    messages = [_message(t, k) for k, t in enumerate(value)]
    users = [k for k, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise ValueError(f"column {column!r}: the conversation has no user turn")
    # a conversation that ends with a tool turn is all prompt: the model's turn reads the tool's result
    last = len(messages) - 1 if messages[-1]["role"] == "tool" else users[-1]
    answer = None
    tail = messages[last + 1:]
    if tail:
        if not answer_from_conversation:
            raise ValueError(f"column {column!r}: the conversation ends with an assistant turn (the answer); "
                             f"set data.answer_from_conversation=true to use it as the reference answer, "
                             f"or drop it from the prompt")
        answer = _text(tail[-1]["content"])
    return [{**m, "content": _text(m["content"])} for m in messages[:last + 1]], answer


def split_placeholders(text: str) -> list[dict]:
    """Chat content items for a text with ``<image>`` / ``<video>`` / ``<audio>`` placeholders: text
    items between ``{"type": "image"}`` (etc.) items, in order; around placeholders, text is stripped and whitespace-only text dropped; a
    text without placeholders is one text item as it is."""
    if not _PLACEHOLDER.search(text):
        return [{"type": "text", "text": text}]  # as it is, whitespace included
    items, pos = [], 0
    for m in _PLACEHOLDER.finditer(text):
        if text[pos:m.start()].strip():
            items.append({"type": "text", "text": text[pos:m.start()].strip()})
        items.append({"type": PLACEHOLDERS[m.group(0)]})
        pos = m.end()
    if text[pos:].strip():
        items.append({"type": "text", "text": text[pos:].strip()})
    return items
