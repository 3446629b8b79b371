"""Length reward: DAPO overlong shaping or a linear penalty."""

from __future__ import annotations

from mmrl.reward_registry import register_reward

from .text import completion_text


@register_reward("length")
def length_reward(prompts, completions, mode: str = "overlong", max_length: int = 512, cache_length: int = 128,
                  completion_ids=None, **kwargs) -> list[float]:
    """L = tokens (from `completion_ids`) or words. 'overlong' (DAPO): 0 for L <= Lmax - Lcache,
    ((Lmax - Lcache) - L) / Lcache up to Lmax, -1 beyond; 'penalty': -min(L / Lmax, 1)."""
    if max_length <= 0:
        raise ValueError(f"length: max_length={max_length} must be > 0")
    if mode == "overlong" and not 0 < cache_length <= max_length:
        raise ValueError(f"length: cache_length={cache_length} must be in (0, max_length={max_length}]")
    if mode not in ("overlong", "penalty"):
        raise ValueError(f"length: mode={mode!r} is not one of overlong, penalty")
    if completion_ids is not None:
        lengths = [len(ids) for ids in completion_ids]
    else:
        lengths = [len(completion_text(c).split()) for c in completions]
    out = []
    for n in lengths:
        if mode == "penalty":
            out.append(-min(n / max_length, 1.0))
        elif n <= max_length - cache_length:
            out.append(0.0)
        elif n <= max_length:
            out.append(((max_length - cache_length) - n) / cache_length)
        else:
            out.append(-1.0)
    return out
