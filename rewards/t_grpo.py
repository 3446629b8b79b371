"""T-GRPO's temporal bonus (Video-R1, github.com/tulerfeng/Video-R1): reward answers that need the
frames in order."""

from __future__ import annotations

import math
from fractions import Fraction

from mmrl.core.scoring import bind_reward, register_reward

from .outputs import TEXT


def exact(x: float) -> Fraction:
    """The number as written in decimal (``repr``), exactly: 0.8 -> 4/5, not the binary float
    0.8000000000000000444, so that 3/5 >= 0.8 x 3/4 holds at the tie."""
    return Fraction(repr(float(x)))


@register_reward("t_grpo", outputs=TEXT)
def t_grpo_reward(prompts, completions, group_id, auxiliary, alpha: float = 0.3, min_ratio: float = 0.8,
                  accuracy: str = "accuracy", accuracy_args: dict | None = None, correct_above: float = 0.1,
                  log_metric=None, **columns) -> list[float | None]:
    """For each prompt group, p = mean `accuracy` reward of its ordered rows and q = mean over its
    auxiliary rows (the rollouts with shuffled frames, `policy.shuffled_rollouts`). If
    p >= min_ratio * q (compared in exact fractions, min_ratio and the scores as written in decimal,
    so an exact tie such as 3 of 5 vs 0.8 x 3 of 4 pays, as Video-R1 does), each ordered row whose accuracy
    is > `correct_above` gets `alpha`, the others 0; else every ordered row gets 0. Means are
    taken per group, never over the batch (Video-R1's code takes them over the local batch, right
    only at one prompt per device).

    Defaults are Video-R1's: alpha 0.3, min_ratio 0.8 (its authors also suggest 1.0), correct when the
    accuracy exceeds 0.1 (its graded rewards count as correct too). `accuracy` names the reward
    that scores correctness, called with `accuracy_args` (e.g. {mode: choice}). None for auxiliary
    rows, for rows whose accuracy is None, and for groups without auxiliary rows (no video).
    `log_metric` counts ``groups`` compared (with ordered and shuffled rows and an accuracy) and
    ``bonus_groups`` among them whose ordered accuracy reached min_ratio x the shuffled one (logged as
    ``reward/t_grpo/<key>``, summed over processes).
    """
    if not min_ratio >= 0:
        raise ValueError(f"t_grpo: min_ratio={min_ratio!r} must be >= 0")
    n = len(completions)
    if len(group_id) != n or len(auxiliary) != n:
        raise ValueError(f"t_grpo: group_id / auxiliary have {len(group_id)} / {len(auxiliary)} values "
                         f"for {n} completions")
    scores = bind_reward(accuracy, accuracy_args)(prompts=prompts, completions=completions, group_id=group_id,
                                                  auxiliary=auxiliary, **columns)
    scores = [math.nan if s is None else float(s) for s in scores]
    ordered: dict[int, list[float]] = {}
    shuffled: dict[int, list[float]] = {}
    for g, aux, s in zip(group_id, auxiliary, scores):
        if not math.isnan(s):
            (shuffled if aux else ordered).setdefault(g, []).append(s)
    compared = ordered.keys() & shuffled.keys()
    min_ratio_exact = exact(min_ratio)
    mean = lambda xs: sum(map(exact, xs)) / len(xs)  # noqa: E731
    bonus_groups = {g for g in compared if mean(ordered[g]) >= min_ratio_exact * mean(shuffled[g])}
    if log_metric is not None:
        log_metric("groups", len(compared))
        log_metric("bonus_groups", len(bonus_groups))
    return [None if aux or math.isnan(s) or g not in compared else
            (float(alpha) if g in bonus_groups and s > correct_above else 0.0)
            for g, aux, s in zip(group_id, auxiliary, scores)]

