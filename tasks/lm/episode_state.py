"""What an episode is while it runs (`episodes.py` runs them, `episode_engines.py` continues their
contexts): `EpisodeState`, one episode's tokens, turns, media and tool calls so far, and
`joined_media`, the per-row media of a batch of episodes joined in turn order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .tools import EpisodeView


@dataclass
class EpisodeState:
    """One episode while it runs. `ids` / `units` / `turn` / `logp`: per token after the prompt
    (units: 1 model, 0 tool; turn: the model turn, -1 a tool token); `token_keys`: per-token
    processor outputs of those tokens; `media`: the row's per-row processor outputs (prompt's
    first, then each tool turn's); `part`: the prompt's `_prompt_parts` entry and `context_text`
    the text of each turn after it (model turns with their special tokens, tool turns as the chat
    template writes them, before a processor expands their images), which a text-taking engine reads."""

    prompt_ids: list[int]
    prompt_keys: dict[str, list[int]]
    media: dict[str, list[Tensor]]
    view: EpisodeView
    part: Any = None
    context_text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    units: list[int] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    token_keys: dict[str, list[int]] = field(default_factory=dict)
    calls: list[dict] = field(default_factory=list)
    turn_texts: list[str] = field(default_factory=list)
    images_returned: int = 0
    done: bool = False
    truncated: bool = False

    def append(self, ids: list[int], unit: int, turn: int, logp: list[float], keys: dict[str, list[int]]) -> None:
        self.ids += ids
        self.units += [unit] * len(ids)
        self.turn += [turn] * len(ids)
        self.logp += logp
        for key in set(self.token_keys) | set(keys):
            done = len(self.ids) - len(ids)
            self.token_keys.setdefault(key, [0] * done).extend(keys.get(key, [0] * len(ids)))

    def stop(self, truncated: bool) -> None:
        self.done, self.truncated = True, truncated


def joined_media(states: list[EpisodeState]) -> dict[str, list[Tensor]]:
    """Each row's per-row media (its prompt's, then its tool turns'), joined; a row without an input
    that another row has gets 0 rows of it."""
    out = {}
    for key in {k for s in states for k in s.media}:
        empty = next(s.media[key][0][:0] for s in states if key in s.media)
        out[key] = [torch.cat(s.media[key], 0) if key in s.media else empty for s in states]
    return out
