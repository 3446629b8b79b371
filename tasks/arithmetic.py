"""Synthetic verifiable arithmetic: ``a+b=`` -> ``<answer>sum</answer>`` (the text demo's task)."""

from __future__ import annotations

import random

from mmrl.registry import DATASETS


def arithmetic_rows(n: int, digits: int, rng: random.Random, ops: str = "+") -> list[dict]:
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10 ** digits), rng.randrange(10 ** digits)
        op = rng.choice(ops)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append({"prompt": f"{a}{op}{b}=", "answer": str(value),
                     "target": f"<answer>{value}</answer>", "difficulty": len(str(a)) + len(str(b))})
    return rows


@DATASETS.register("arithmetic")
def arithmetic(n_train: int = 2000, n_eval: int = 200, digits: int = 3, ops: str = "+", seed: int = 0):
    """Two random `digits`-digit operands; held-out rows never appear in training."""
    rng = random.Random(seed)
    train = arithmetic_rows(n_train, digits, rng, ops)
    seen = {r["prompt"] for r in train}
    held_out = [r for r in arithmetic_rows(n_eval * 2, digits, rng, ops) if r["prompt"] not in seen][:n_eval]
    return {"train": train, "eval": held_out}
