"""Synthetic verifiable text tasks for the text demo and tests: ``a+b=`` -> ``<answer>sum</answer>``
and ``sort:3816=`` -> ``<answer>1368</answer>``. Held-out rows never appear in training."""

from __future__ import annotations

import random
from typing import Callable

from mmrl.registry import DATASETS


def arithmetic_rows(n: int, digits: int, rng: random.Random, ops: str = "+", tag: str = "answer") -> list[dict]:
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10 ** digits), rng.randrange(10 ** digits)
        op = rng.choice(ops)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append({"prompt": f"{a}{op}{b}=", "answer": str(value),
                     "target": f"<{tag}>{value}</{tag}>", "difficulty": len(str(a)) + len(str(b))})
    return rows


def sorting_rows(n: int, length: int, rng: random.Random, tag: str = "answer") -> list[dict]:
    rows = []
    for _ in range(n):
        size = rng.randint(2, length)
        digits = "".join(rng.choice("0123456789") for _ in range(size))
        answer = "".join(sorted(digits))
        rows.append({"prompt": f"sort:{digits}=", "answer": answer, "target": f"<{tag}>{answer}</{tag}>",
                     "difficulty": size})
    return rows


def _split(make: Callable[[int], list[dict]], n_train: int, n_eval: int) -> dict[str, list[dict]]:
    train = make(n_train)
    seen = {r["prompt"] for r in train}
    held_out = [r for r in make(n_eval * 4) if r["prompt"] not in seen][:n_eval]
    return {"train": train, "eval": held_out}


@DATASETS.register("arithmetic")
def arithmetic(n_train: int = 2000, n_eval: int = 200, digits: int = 3, ops: str = "+", seed: int = 0,
               tag: str = "answer"):
    """Two random `digits`-digit operands and an operator from `ops` (targets tagged `<tag>`)."""
    rng = random.Random(seed)
    return _split(lambda n: arithmetic_rows(n, digits, rng, ops, tag), n_train, n_eval)


@DATASETS.register("sorting")
def sorting(n_train: int = 4000, n_eval: int = 200, length: int = 6, seed: int = 0, tag: str = "answer"):
    """Sort 2..`length` random digits ascending (answers are checked exactly; targets tagged `<tag>`)."""
    rng = random.Random(seed)
    return _split(lambda n: sorting_rows(n, length, rng, tag), n_train, n_eval)
