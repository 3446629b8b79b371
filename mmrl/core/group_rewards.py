"""Rewards that score a whole prompt group at once: ``@register_reward(name, per_group=True)``.

Such a reward (a pairwise or groupwise judge: each row's win rate within its group, Pref-GRPO) is
called once per prompt group with that group's rows (its prompts, completions and columns, the
engine's ``group_id`` and ``auxiliary`` included) and returns one value per row, as any reward
does for the rows it is given; the values go on as any reward's.

A group is always whole where it is scored: the engine hands each process whole groups (a draw's
groups are split into contiguous blocks, one per process, `train/collect.py`), and overlapped
scoring hands over whole groups (`train/chunk_scoring.py`), so no group ever needs gathering from
other processes. Where the engine scores extra completions standing for some rows (a step-level
adapter's intermediate states), the group is the rows given of that group.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

GROUP_FLAG = "scores_groups"  # the attribute `register_reward(..., per_group=True)` sets on the function


def scores_groups(fn: Callable) -> bool:
    """Whether `fn` (a registered reward, possibly with bound arguments or columns) scores whole
    groups: the flag on it or on the function it wraps (`functools.partial`, a column binding)."""
    while fn is not None:
        if getattr(fn, GROUP_FLAG, False):
            return True
        fn = getattr(fn, "func", None)
    return False


def rows_by_group(group_id: Sequence[int]) -> dict[int, list[int]]:
    """Group id -> the positions of its rows, groups in order of first appearance."""
    out: dict[int, list[int]] = {}
    for i, g in enumerate(group_id):
        out.setdefault(g, []).append(i)
    return out


def call_per_group(fn: Callable, prompts: Sequence[Any], completions: Sequence[Any],
                   columns: Mapping[str, Sequence[Any]], extra: Mapping[str, Any]) -> list[Any]:
    """`fn` called once per group of `columns["group_id"]` with that group's rows (`extra`: keyword
    arguments given whole, e.g. ``log_metric``); the values put back at their rows. A call that
    returns the wrong number of values is a ValueError naming the group."""
    out: list[Any] = [None] * len(completions)
    for group, rows in rows_by_group(columns["group_id"]).items():
        values = list(fn(prompts=[prompts[i] for i in rows], completions=[completions[i] for i in rows],
                         **{k: [v[i] for i in rows] for k, v in columns.items()}, **extra))
        if len(values) != len(rows):
            raise ValueError(f"returned {len(values)} values for the {len(rows)} rows of group {group}")
        for i, value in zip(rows, values):
            out[i] = value
    return out
