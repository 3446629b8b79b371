"""A reward model's pairwise accuracy against human preferences, as VideoAlign reports it on
VideoGen-RewardBench (KwaiVGI/VideoAlign ``calc_accuracy.py``; Deutsch et al. 2023's tie
calibration): human labels h = 1 (A preferred), -1 (B preferred), 0 (a tie); the model's margin
m = score(A) - score(B).

  accuracy without ties  C / (C + D + Tm): pairs the human does not call a tie, the model's sign
                         agreeing (C), disagreeing (D) or exactly 0 (Tm)
  accuracy with ties     the best over thresholds e of (C + Thm) / all pairs, a margin |m| <= e
                         counting as the model's tie (Thm: both tie); e runs over the sorted |m|,
                         the pairs moved to the new threshold one at a time in that order, as the
                         authors' incremental count does (pairs of equal |m| included)
"""

from __future__ import annotations

from typing import Sequence

LABELS = {"A": 1, "B": -1, "same": 0}


def _kind(h: int, m: float, epsilon: float, strict: bool = False) -> str:
    tie = abs(m) < epsilon if strict else abs(m) <= epsilon
    if h == 0:
        return "Thm" if tie else "Th"
    if tie:
        return "Tm"
    return "C" if h * m > 0 else "D"


def accuracy_without_ties(h: Sequence[int], m: Sequence[float]) -> float:
    kinds = [_kind(hi, mi, -1) for hi, mi in zip(h, m)]
    agree, disagree, model_ties = kinds.count("C"), kinds.count("D"), kinds.count("Tm")
    return agree / (agree + disagree + model_ties)


def accuracy_with_ties(h: Sequence[int], m: Sequence[float]) -> float:
    counts = {"C": 0, "D": 0, "Th": 0, "Tm": 0, "Thm": 0}
    for hi, mi in zip(h, m):
        counts[_kind(hi, mi, -1)] += 1
    best, epsilon = float("-inf"), -1.0
    for hi, mi in sorted(zip(h, m), key=lambda pair: abs(pair[1])):
        counts[_kind(hi, mi, epsilon, strict=True)] -= 1
        epsilon = abs(mi)
        counts[_kind(hi, mi, epsilon)] += 1
        best = max(best, (counts["C"] + counts["Thm"]) / sum(counts.values()))
    return best
