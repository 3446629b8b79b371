"""Length reward: DAPO overlong shaping or a linear penalty."""

from __future__ import annotations

from typing import Literal, get_args

from mmrl.core.scoring import register_reward

from .outputs import TEXT
from .text import completion_text

Mode = Literal["overlong", "penalty"]
Unit = Literal["tokens", "words"]
MODES, UNITS = get_args(Mode), get_args(Unit)


@register_reward("length", outputs=TEXT)
def length_reward(prompts, completions, mode: Mode = "overlong", max_length: int = 512, cache_length: int = 128,
                  target: int | None = None, unit: Unit = "tokens", completion_ids=None, **kwargs) -> list[float]:
    """A length-based reward; L = len(completion_ids[i]) (the trainer passes token ids) when
    ``unit="tokens"`` and ids are given, else the number of whitespace-separated words.

    ``overlong`` (DAPO soft overlong punishment), with Lmax = max_length, Lc = cache_length:
    0 for L <= Lmax - Lc; ((Lmax - Lc) - L) / Lc for Lmax - Lc < L <= Lmax; -1 for L > Lmax.
    ``penalty``: -min(|L - target| / Lmax, 1), target 0 when None (so -min(L / Lmax, 1)).
    """
    if mode not in MODES:
        raise ValueError(f"length: mode={mode!r} is not one of {', '.join(MODES)}")
    if unit not in UNITS:
        raise ValueError(f"length: unit={unit!r} is not one of {', '.join(UNITS)}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0:
        raise ValueError(f"length: max_length={max_length!r} must be an integer > 0")
    if mode == "overlong":
        if not isinstance(cache_length, (int, float)) or not 0 < cache_length <= max_length:
            raise ValueError(f"length: cache_length={cache_length!r} must be in (0, max_length={max_length}]")
        if target is not None:
            raise ValueError(f"length: target={target!r} applies only to mode='penalty'")
    elif target is not None and (not isinstance(target, (int, float)) or not 0 <= target <= max_length):
        raise ValueError(f"length: target={target!r} must be in [0, max_length={max_length}]")
    if unit == "tokens" and completion_ids is not None:
        if len(completion_ids) != len(completions):
            raise ValueError(f"length: completion_ids has {len(completion_ids)} rows for "
                             f"{len(completions)} completions")
        lengths = [len(ids) for ids in completion_ids]
    else:
        lengths = [len(completion_text(c).split()) for c in completions]
    out = []
    for n in lengths:
        if mode == "penalty":
            out.append(-min(abs(n - (target or 0)) / max_length, 1.0))
        elif n <= max_length - cache_length:
            out.append(0.0)
        elif n <= max_length:
            out.append(((max_length - cache_length) - n) / cache_length)
        else:
            out.append(-1.0)
    return out
