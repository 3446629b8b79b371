"""Which data-set prompts a training step uses; identical on every process, never the global RNG.

Strategies (docs/methods.md, 'Prompt sampling'):

* ``uniform``: epochs of a seeded shuffle, without replacement, with a data position
  (epoch, offset) that advances and wraps to a new epoch;
* curriculum (SARI): with ``curriculum_column`` set, rows are walked easy -> hard by that column,
  wrapping around (applies to the sequential walk, i.e. strategy ``uniform``);
* ``variance``: MMR1 Variance-Aware Sampling, which favours prompts whose recent outcomes vary,
  since low reward variance makes the GRPO gradient vanish. As MMR1's trainer (LengSicong/MMR1,
  `verl/curriculum`, `examples/mmr1.yaml`): the Variance Promotion Score of a prompt is p(1 - p)
  with p its pass rate (``variance_score``), the scores are min-max scaled over the whole data
  set (``variance_scaling``), and a share ``variance_mix`` of the draws follows them, the rest is
  uniform. MMR1 re-scores the whole data set with fresh rollouts every few steps; mmrl scores a
  prompt from the outcomes of its last ``variance_window`` draws in training (unseen prompts get
  the largest seen score), so no extra rollouts are spent. MMR1's trajectory-diversity metrics
  (distinct-n, self-BLEU, edit distance) are off in its published configuration and are not
  offered.

All randomness comes from generators seeded by `derive_seed`, and all state is in
`PromptSampler.state_dict`, so a resumed run draws exactly what an uninterrupted one would.
DAPO dynamic sampling draws again within a step (``attempt`` > 0): a step never repeats a prompt
unless it asks for more prompts than the data set has.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

import torch
from torch import Tensor

from mmrl.config.rollouts import SamplingConfig
from mmrl.core.seeding import derive_seed

UNSEEN_VPS = 0.25  # the largest variance of a 0/1 outcome: p(1-p) at p = 1/2


MIN_MAX_EPS = 1e-8  # MMR1: (w - min) / (max - min + 1e-8)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def curriculum_order(dataset: Sequence[dict], column: str, descending: bool = False) -> list[int]:
    """Row indices ordered easy -> hard by `column` (ascending; `descending` reverses), ties in
    data-set order (SARI curriculum). Raises ValueError naming the column and the first row
    without a number there."""
    for i, row in enumerate(dataset):
        value = row.get(column) if isinstance(row, dict) else None
        if not _is_number(value):
            raise ValueError(f"sampling.curriculum_column={column!r}: row {i} has {value!r} "
                             f"there, not a number")
    # sorted() is stable, and reverse=True keeps ties in their original order too
    return sorted(range(len(dataset)), key=lambda i: dataset[i][column], reverse=descending)


def _stable_defer(order: list[int], deferred: set[int]) -> list[int]:
    """`order` with the members of `deferred` moved to its end (relative orders kept)."""
    if not deferred:
        return order
    return [i for i in order if i not in deferred] + [i for i in order if i in deferred]


class PromptSampler:
    """Draws the prompts of each step: uniform epochs, a curriculum walk (SARI), or MMR1
    Variance-Aware Sampling. Deterministic given (seed, the draws and updates so far)."""

    def __init__(self, dataset: Sequence[dict], cfg: SamplingConfig, seed: int):
        if len(dataset) == 0:
            raise ValueError("the training set is empty: PromptSampler needs at least one row")
        if cfg.strategy not in ("uniform", "variance"):
            raise ValueError(f"sampling.strategy={cfg.strategy!r} is not one of 'uniform', 'variance'")
        if cfg.variance_window < 1:
            raise ValueError(f"sampling.variance_window={cfg.variance_window} must be >= 1")
        if not 0.0 <= cfg.variance_mix <= 1.0:
            raise ValueError(f"sampling.variance_mix={cfg.variance_mix} must be in [0, 1]")
        if cfg.variance_score not in ("pass_rate", "variance"):
            raise ValueError(f"sampling.variance_score={cfg.variance_score!r} is not one of 'pass_rate', 'variance'")
        if cfg.variance_scaling not in ("min_max", "none"):
            raise ValueError(f"sampling.variance_scaling={cfg.variance_scaling!r} is not one of 'min_max', 'none'")
        self.n = len(dataset)
        self.cfg = cfg
        self.seed = int(seed)
        self.order = (curriculum_order(dataset, cfg.curriculum_column, cfg.curriculum_descending)
                      if cfg.curriculum_column else None)
        # data position of the sequential walk; `deferred`: prompts moved to the end of the
        # current epoch's order because the step in which that epoch began had already drawn them
        self.epoch, self.offset = 0, 0
        self.deferred: list[int] = []
        self.drawn = 0  # prompts drawn so far, all strategies
        # the step being drawn and the prompts it has drawn so far (over its attempts)
        self.step: int | None = None
        self.used: list[int] = []
        # variance: recent outcome rewards per prompt
        self.outcomes: dict[int, deque] = {}
        self._epoch_cache: tuple[int, tuple[int, ...], list[int]] | None = None

    # ----- drawing ----------------------------------------------------------------------------
    def _epoch_order(self) -> list[int]:
        """This epoch's order: the curriculum, or a permutation from derive_seed(seed, epoch);
        with the deferred prompts moved to its end."""
        key = (self.epoch, tuple(self.deferred))
        if self._epoch_cache is not None and self._epoch_cache[:2] == key:
            return self._epoch_cache[2]
        if self.order is not None:
            base = self.order
        else:
            g = torch.Generator().manual_seed(derive_seed(self.seed, self.epoch))
            base = torch.randperm(self.n, generator=g).tolist()
        order = _stable_defer(base, set(self.deferred))
        self._epoch_cache = (*key, order)
        return order

    def _sequential(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            order = self._epoch_order()
            take = order[self.offset:self.offset + k - len(out)]
            out += take
            self.used += take
            self.offset += len(take)
            if self.offset >= self.n:
                # a new epoch; prompts this step already drew go last, so that the step does not
                # repeat them (unless it asks for more prompts than there are)
                self.epoch, self.offset = self.epoch + 1, 0
                used = set(self.used)
                self.deferred = sorted(used) if len(used) < self.n else []
        return out

    def _variance(self, k: int, step: int, attempt: int) -> list[int]:
        g = torch.Generator().manual_seed(derive_seed(self.seed, step, attempt))
        probs = self.probabilities()
        out: list[int] = []
        while len(out) < k:
            available = torch.ones(self.n, dtype=torch.bool)
            if self.used:
                available[torch.tensor(self.used, dtype=torch.long)] = False
            if not bool(available.any()):  # everything drawn this step: start over
                self.used = []
                continue
            p = torch.where(available, probs, torch.zeros_like(probs))
            if float(p.sum()) <= 0:
                p = available.to(probs.dtype)
            take = torch.multinomial(p, min(k - len(out), int(available.sum())), replacement=False,
                                     generator=g).tolist()
            out += take
            self.used += take
        return out

    def draw(self, step: int, num_groups: int, attempt: int = 0) -> list[int]:
        """Data-set indices of the `num_groups` prompts (one per group) of `step`; `attempt` > 0
        draws more for the same step (DAPO dynamic sampling), continuing the data position and
        never repeating a prompt within the step unless the data set is too small."""
        if num_groups < 0:
            raise ValueError(f"num_groups={num_groups} must be >= 0")
        if step != self.step:
            self.step, self.used = int(step), []
        if self.cfg.strategy == "uniform":
            out = self._sequential(num_groups)
        else:
            out = self._variance(num_groups, int(step), int(attempt))
        self.drawn += len(out)
        return out

    # ----- MMR1 Variance Promotion Score ------------------------------------------------------
    def vps(self) -> Tensor:
        """Variance Promotion Score of every prompt (float64, one per row) from its recent
        outcomes: p(1 - p) of their mean p (``pass_rate``, MMR1) or their population variance
        (``variance``); prompts never seen get the largest score among seen prompts, or 0.25 if
        none has been seen."""
        scores = torch.full((self.n,), float("nan"), dtype=torch.float64)
        for i, window in self.outcomes.items():
            if window:
                mean = math.fsum(window) / len(window)
                if self.cfg.variance_score == "pass_rate":
                    scores[i] = mean * (1 - mean)
                else:
                    scores[i] = math.fsum((v - mean) ** 2 for v in window) / len(window)
        seen = scores[~scores.isnan()]
        prior = float(seen.max()) if seen.numel() else UNSEEN_VPS
        return torch.nan_to_num(scores, nan=prior).clamp_min(0.0)

    def probabilities(self) -> Tensor:
        """Sampling probabilities of the "variance" strategy (MMR1): with w the VPS, min-max
        scaled over the data set ((w - min) / (max - min + 1e-8)) unless variance_scaling is none,
        variance_mix * w / sum w + (1 - variance_mix) / num_prompts; uniform if every w is 0."""
        v = self.vps()
        if self.cfg.variance_scaling == "min_max":
            v = (v - v.min()) / (v.max() - v.min() + MIN_MAX_EPS)
        uniform = torch.full((self.n,), 1.0 / self.n, dtype=torch.float64)
        total = float(v.sum())
        if total <= 0:
            return uniform
        mix = self.cfg.variance_mix
        return mix * v / total + (1 - mix) * uniform

    # ----- feedback ---------------------------------------------------------------------------
    def update(self, indices: Sequence[int], rewards: Tensor, group_id: Tensor) -> None:
        """Record a draw's outcomes: every reward of group g (rows with group_id == g) goes into
        the window of prompt indices[g], which keeps the last variance_window * group_size values;
        NaN (and infinite) rewards are ignored. Used by "variance" only, harmless otherwise;
        with variance_score pass_rate an outcome outside [0, 1] is an error."""
        rewards = torch.as_tensor(rewards).detach().reshape(-1).double().cpu()
        group_id = torch.as_tensor(group_id).detach().reshape(-1).long().cpu()
        if rewards.numel() != group_id.numel():
            raise ValueError(f"update: {rewards.numel()} rewards but {group_id.numel()} group ids")
        for g, idx in enumerate(indices):
            idx = int(idx)
            if not 0 <= idx < self.n:
                raise IndexError(f"update: prompt index {idx} is outside the data set (size {self.n})")
            rows = rewards[group_id == g]
            if rows.numel() == 0:
                continue
            finite = [v for v in rows.tolist() if math.isfinite(v)]
            if (self.cfg.strategy == "variance" and self.cfg.variance_score == "pass_rate"
                    and any(not 0.0 <= v <= 1.0 for v in finite)):
                raise ValueError(f"sampling.variance_score='pass_rate' needs outcomes in [0, 1]; prompt {idx} "
                                 f"got {next(v for v in finite if not 0.0 <= v <= 1.0)} (set sampling.variance_reward "
                                 f"to a 0/1 accuracy reward, or sampling.variance_score=variance)")
            maxlen = self.cfg.variance_window * rows.numel()
            window = self.outcomes.get(idx)
            if window is None or window.maxlen != maxlen:
                window = self.outcomes[idx] = deque(window or (), maxlen=maxlen)
            window.extend(finite)

    # ----- logging and checkpoints ------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Scalars for logging: epoch (fractional: prompts drawn / data-set size for "variance")
        and, for "variance", the mean VPS and the share of prompts seen."""
        if self.cfg.strategy == "uniform":
            out = {"sampling/epoch": self.epoch + self.offset / self.n}
        else:
            v = self.vps()
            out = {"sampling/epoch": self.drawn / self.n,
                   "sampling/mean_vps": float(v.mean()),
                   "sampling/max_vps": float(v.max()),
                   "sampling/seen": sum(1 for w in self.outcomes.values() if w) / self.n}
        return out

    def state_dict(self) -> dict:
        """Everything a resumed run needs to draw what an uninterrupted one would (JSON-able)."""
        return {"n": self.n, "epoch": self.epoch, "offset": self.offset,
                "deferred": list(self.deferred), "drawn": self.drawn,
                "step": self.step, "used": list(self.used),
                "outcomes": {str(k): [list(v), v.maxlen] for k, v in self.outcomes.items()}}

    def load_state_dict(self, state: dict) -> None:
        if "n" in state and int(state["n"]) != self.n:
            raise ValueError(f"sampler state is for a data set of {state['n']} rows, not {self.n}")
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self.deferred = [int(i) for i in state.get("deferred", [])]
        self.drawn = int(state.get("drawn", 0))
        self.step = None if state.get("step") is None else int(state["step"])
        self.used = [int(i) for i in state.get("used", [])]
        self.outcomes = {int(k): deque((float(x) for x in v), maxlen=int(m))
                         for k, (v, m) in state["outcomes"].items()}
        self._epoch_cache = None
