"""Pairwise preferences made into per-row rewards: each row's win rate within its prompt group
(Pref-GRPO, whose advantages are the group-normalised win rates).

`win_rates(items, prefer)` turns a preference function ``prefer(a, b) -> p`` (the probability
that `a` beats `b`, in [0, 1]) into one win rate per item. The convention is Pref-GRPO's
(CodeGoat24/Pref-GRPO, ``fastvideo/rewards/unifiedreward_think.py``, ``_pairwise_win_rate``):
every unordered pair i < j of the group is judged once with the earlier row shown first; a win
counts 1 to the winner, a tie 0.5 to each; an item's win rate is its wins over its n - 1
comparisons. With a probability, row i gains p and row j gains 1 - p (a judge answering 1, 0 or
0.5 gives the authors' counts exactly). ``pairs="both"`` instead judges every ordered pair, (a, b)
and (b, a), and averages the two, which cancels a judge's preference for the first position at
twice the calls. The authors round the rate to 3 decimals; so does the reward ``win_rate`` (its
``decimals``, 3 by default; null keeps every digit).

The registered reward ``win_rate`` calls a preference function named in the recipe
(``rewards.win_rate.args.prefer: FILE.py:FUNCTION`` or ``MODULE:FUNCTION``, called as
``prefer(a, b)`` on two completions, with the group's ``prompt`` and data columns passed to the
further parameters it names, as Pref-GRPO's judge sees the prompt) once per prompt group; a group
of one row has no win rate (None). Rates are rounded to ``decimals`` places (3, as the authors;
null: not rounded), as the served judge ``judge_pairwise`` rounds them.
"""

from __future__ import annotations

import functools
import inspect
from itertools import combinations
from typing import Any, Callable, Literal, Sequence

from mmrl.core.plain_rewards import is_plain_reward, load_plain_reward
from mmrl.core.scoring import register_reward

Preference = Callable[[Any, Any], float]  # prefer(a, b) -> p(a beats b) in [0, 1]


def judged(prefer: Preference, a: Any, b: Any) -> float:
    """prefer(a, b), checked to be a probability."""
    p = float(prefer(a, b))
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"the preference function returned {p} for a pair; expected p(a beats b) in [0, 1]")
    return p


def win_rates(items: Sequence[Any], prefer: Preference, pairs: Literal["once", "both"] = "once",
              decimals: int | None = None) -> list[float]:
    """Each item's win rate against the others (the module docstring's convention), rounded to
    `decimals` places when given (Pref-GRPO rounds to 3); needs >= 2 items."""
    if pairs not in ("once", "both"):
        raise ValueError(f"pairs={pairs!r}: choose 'once' (each unordered pair, Pref-GRPO) or 'both' (each order)")
    n = len(items)
    if n < 2:
        raise ValueError(f"a win rate needs at least 2 items, got {n}")
    wins = [0.0] * n
    for i, j in combinations(range(n), 2):
        p = judged(prefer, items[i], items[j])
        if pairs == "both":
            p = (p + 1.0 - judged(prefer, items[j], items[i])) / 2
        wins[i] += p
        wins[j] += 1.0 - p
    rates = [w / (n - 1) for w in wins]
    return rates if decimals is None else [round(r, decimals) for r in rates]


@register_reward("win_rate", per_group=True)
def win_rate(prompts, completions, prefer: str, pairs: Literal["once", "both"] = "once", decimals: int | None = 3,
             prefer_args: dict | None = None, **columns):
    """Each completion's win rate within its prompt group under the preference function `prefer`
    names (``FILE.py:FUNCTION`` or ``MODULE:FUNCTION``, ``prefer(a, b, ...) -> p(a beats b)``; the
    parameters it names after the two completions get the group's ``prompt`` or data column of
    that name, or the value `prefer_args` gives them), rounded to `decimals` places (3, as Pref-GRPO;
    None: not rounded)."""
    if len(completions) < 2:
        return [None] * len(completions)
    judge = group_preference(preference_function(prefer), prompts, columns, prefer_args or {})
    return win_rates(completions, judge, pairs, decimals)


def group_preference(prefer: Preference, prompts: Sequence[Any], columns: dict[str, Any],
                     fixed: dict[str, Any] | None = None) -> Preference:
    """`prefer` with the parameters it names after (a, b) bound to `fixed` (the recipe's
    `prefer_args`), else to the group's prompt (``prompt``) or data columns (a group is one data
    row: its first row's values)."""
    row = {"prompt": prompts[0], **{k: v[0] for k, v in columns.items() if isinstance(v, (list, tuple)) and v}}
    params = list(inspect.signature(prefer).parameters.values())[2:]
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    fixed = dict(fixed or {})
    unknown = sorted(set(fixed) - {p.name for p in named})
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in params):
        raise ValueError(f"rewards.win_rate.args.prefer_args: {unknown} are not parameters of the preference "
                         f"function {getattr(prefer, '__name__', prefer)!r} ({', '.join(p.name for p in named)})")
    bound = {k: v for k, v in fixed.items() if k in unknown}
    for param in named:
        if param.name in fixed:
            bound[param.name] = fixed[param.name]
        elif param.name in row:
            bound[param.name] = row[param.name]
        elif param.default is param.empty:
            raise ValueError(f"the preference function {getattr(prefer, '__name__', prefer)!r} takes {param.name!r}, "
                             f"which is neither 'prompt' nor a data column ({', '.join(sorted(row))})")
    return functools.partial(prefer, **bound) if bound else prefer


@functools.lru_cache(maxsize=None)
def preference_function(name: str) -> Preference:
    """The function `name` names, as a plain reward is named (imported once)."""
    if not is_plain_reward(name):
        raise ValueError(f"rewards.win_rate.args.prefer={name!r}: name the preference function as FILE.py:FUNCTION "
                         "or MODULE:FUNCTION")
    return load_plain_reward(name).function
