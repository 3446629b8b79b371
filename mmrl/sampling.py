"""Which data-set prompts a step uses; identical on every process, never the global RNG.

Strategies: uniform epochs without replacement; a curriculum walk easy -> hard by a column
(SARI); MMR1's Variance-Aware Sampling, which favours prompts whose recent outcomes vary
(Variance Promotion Score = outcome variance + diversity), since low reward variance makes the
GRPO gradient vanish.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from typing import Sequence

import torch
from torch import Tensor

from .config import SamplingConfig


def derive_seed(*values: int) -> int:
    """A stable 63-bit seed mixed from integers (same on every process, every run)."""
    digest = hashlib.blake2b(",".join(str(int(v)) for v in values).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def curriculum_order(dataset: Sequence[dict], column: str, descending: bool = False) -> list[int]:
    """Row indices sorted by `column` (easy to hard), ties in data-set order."""
    for i, row in enumerate(dataset):
        value = row.get(column)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"sampling.curriculum_column={column!r}: row {i} has {value!r}, not a number")
    return sorted(range(len(dataset)), key=lambda i: dataset[i][column], reverse=descending)


class PromptSampler:
    def __init__(self, dataset: Sequence[dict], cfg: SamplingConfig, seed: int):
        if not dataset:
            raise ValueError("the training set is empty")
        if cfg.strategy not in ("uniform", "variance"):
            raise ValueError(f"sampling.strategy={cfg.strategy!r} is not one of uniform, variance")
        self.n = len(dataset)
        self.cfg = cfg
        self.seed = seed
        self.order = curriculum_order(dataset, cfg.curriculum_column, cfg.curriculum_descending) \
            if cfg.curriculum_column else None
        self.epoch, self.offset = 0, 0
        self.outcomes: dict[int, deque] = {}
        self.diversity: dict[int, float] = {}
        self.window = max(1, cfg.variance_window)

    # ----- drawing ----------------------------------------------------------------------------
    def _epoch_order(self) -> list[int]:
        if self.order is not None:
            return self.order
        g = torch.Generator().manual_seed(derive_seed(self.seed, self.epoch))
        return torch.randperm(self.n, generator=g).tolist()

    def _sequential(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            order = self._epoch_order()
            take = order[self.offset:self.offset + k - len(out)]
            out += take
            self.offset += len(take)
            if self.offset >= self.n:
                self.epoch, self.offset = self.epoch + 1, 0
        return out

    def vps(self) -> Tensor:
        """Variance Promotion Score of every prompt (unseen prompts: the max seen, or 0.25)."""
        scores = torch.full((self.n,), float("nan"), dtype=torch.float64)
        for i, window in self.outcomes.items():
            if window:
                values = torch.tensor(list(window), dtype=torch.float64)
                scores[i] = values.var(unbiased=False) + self.cfg.diversity_weight * self.diversity.get(i, 0.0)
        seen = scores[~scores.isnan()]
        prior = float(seen.max()) if seen.numel() else 0.25
        return torch.nan_to_num(scores, nan=prior)

    def probabilities(self) -> Tensor:
        """variance_mix * VPS / sum VPS + (1 - variance_mix) / num_prompts (MMR1)."""
        v = self.vps()
        uniform = torch.full((self.n,), 1.0 / self.n, dtype=torch.float64)
        if float(v.sum()) <= 0:
            return uniform
        return self.cfg.variance_mix * v / v.sum() + (1 - self.cfg.variance_mix) * uniform

    def draw(self, step: int, num_groups: int, attempt: int = 0) -> list[int]:
        """Data-set indices of `num_groups` prompts for this step (and DAPO attempt)."""
        if self.cfg.strategy == "uniform":
            return self._sequential(num_groups)
        g = torch.Generator().manual_seed(derive_seed(self.seed, step, attempt))
        k = min(num_groups, self.n)
        picked = torch.multinomial(self.probabilities(), k, replacement=False, generator=g).tolist()
        if k < num_groups:
            picked += torch.multinomial(self.probabilities(), num_groups - k, replacement=True, generator=g).tolist()
        return picked

    # ----- feedback ---------------------------------------------------------------------------
    def update(self, indices: Sequence[int], rewards: Tensor, group_id: Tensor,
               diversity: Sequence[float] | None = None) -> None:
        """Record the outcomes of group g (rows with group_id == g) for prompt indices[g]."""
        for g, idx in enumerate(indices):
            values = [v for v in rewards[group_id == g].reshape(-1).tolist() if not math.isnan(v)]
            window = self.outcomes.setdefault(int(idx), deque(maxlen=self.window * max(len(values), 1)))
            window.extend(values)
            if diversity is not None:
                self.diversity[int(idx)] = float(diversity[g])

    def stats(self) -> dict[str, float]:
        out = {"sampling/epoch": float(self.epoch)}
        if self.cfg.strategy == "variance":
            out["sampling/mean_vps"] = float(self.vps().mean())
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset,
                "outcomes": {str(k): [list(v), v.maxlen] for k, v in self.outcomes.items()},
                "diversity": {str(k): v for k, v in self.diversity.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self.outcomes = {int(k): deque(v, maxlen=m) for k, (v, m) in state["outcomes"].items()}
        self.diversity = {int(k): float(v) for k, v in state["diversity"].items()}
