"""The rollout record shared by every adapter (docs/architecture.md, 'The one contract: action units')."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Sequence

import torch
from torch import Tensor


@dataclass
class Rollout:
    """N = prompts x group_size rollouts, each a sequence of U stochastic units.

    `completions` is what the rewards see (text, images, audio); `columns` holds the data-set
    fields of each row's prompt; `extras` holds whatever the adapter needs to recompute
    log-probs (token ids, latents, timesteps): tensors whose first dimension is N, or lists of
    length N. (The engine keeps the old and reference log-probs of a step itself.)

    `rollout_logp` (float32 [N, U], None: the sampler gives none) is the log-prob of each unit
    under the sampler that drew it, recorded at rollout time (0 at padding); the engine compares it
    with the training forward's old log-probs (`rollout/logp_diff_*`) and uses it for
    `algorithm.rollout_correction` (docs/methods.md, 'Rollout correction').

    `auxiliary` (bool [N], None: no such rows) marks rows an adapter draws only for the rewards to
    compare against, e.g. T-GRPO's rollouts of the same prompt with its video frames shuffled.
    They carry the group id of their prompt and sit inside its block of rows; the rewards score
    them with the others (`score_rollout`), then the engine drops them: they have no advantage,
    take no part in the loss and are left out of the reward statistics.

    `weights_version` (long [N], None: not stamped yet) is the version of the weights that drew
    each row: the number of optimizer steps they had taken (0: the initial weights). The engine
    stamps it when the rows come back from the sampler; a row's staleness is the version being
    updated minus its own (`staleness_metrics`; 0 in a synchronous run).
    """

    group_id: Tensor
    prompts: list[Any]
    completions: list[Any]
    unit_mask: Tensor
    columns: dict[str, list[Any]] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    truncated: Tensor | None = None
    auxiliary: Tensor | None = None
    rollout_logp: Tensor | None = None
    weights_version: Tensor | None = None

    def __len__(self) -> int:
        return int(self.group_id.shape[0])

    @property
    def num_units(self) -> int:
        return int(self.unit_mask.shape[1])

    def stamp_version(self, version: int) -> None:
        """Record that every row was drawn by the weights after `version` optimizer steps."""
        self.weights_version = torch.full((len(self),), version, dtype=torch.long)

    def add_data_columns(self, rows: Sequence[dict]) -> None:
        """Give every row the data-set fields of its prompt (`rows[k]` for the k-th group of
        consecutive rows, whatever the group's size); columns the adapter set itself (e.g.
        `completion_ids`) take precedence."""
        if not rows:
            return
        groups, prompt = torch.unique_consecutive(self.group_id, return_inverse=True)
        if len(groups) != len(rows):
            raise ValueError(f"the rollout has {len(groups)} groups of consecutive rows for {len(rows)} prompts")
        for key in rows[0]:
            self.columns.setdefault(key, [rows[k].get(key) for k in prompt.tolist()])

    def select(self, rows: Sequence[int] | Tensor) -> "Rollout":
        """The sub-rollout of the given row indices (every per-row field indexed)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("columns", "extras"):
                picked[f.name] = {k: take_rows(v, idx, len(self)) for k, v in value.items()}
            else:
                picked[f.name] = take_rows(value, idx, len(self))
        return replace(self, **picked)

    @staticmethod
    def concat(parts: Sequence["Rollout"]) -> "Rollout":
        """Join rollouts row-wise; the adapter pads tensors to a common unit count first."""
        if len(parts) == 1:
            return parts[0]
        out = {}
        for f in fields(Rollout):
            values = [getattr(p, f.name) for p in parts]
            if f.name in ("columns", "extras"):
                out[f.name] = {k: _cat([v[k] for v in values]) for k in values[0]}
            else:
                out[f.name] = _cat(values)
        return Rollout(**out)


def staleness_metrics(versions: Tensor, current_version: int) -> dict[str, float]:
    """`rollout/staleness_mean` and `_max` over rows drawn by weights `versions` [N] and trained
    by the weights of `current_version`: how many optimizer steps behind each row's weights are."""
    if not len(versions):
        return {}
    behind = (current_version - versions).float()
    return {"rollout/staleness_mean": float(behind.mean()), "rollout/staleness_max": float(behind.max())}


def take_rows(value: Any, idx: Tensor, n: int) -> Any:
    """Rows `idx` of a per-row value (a tensor or list of length n); anything else as is."""
    if value is None:
        return None
    if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == n:
        return value[idx.to(value.device)]
    if isinstance(value, list) and len(value) == n:
        return [value[i] for i in idx.tolist()]
    return value  # shared across rows (a scalar, a prompt length, a schedule)


def _cat(values: list[Any]) -> Any:
    if values[0] is None:
        return None
    if isinstance(values[0], Tensor):
        return torch.cat(values, dim=0)
    if isinstance(values[0], list):
        return [x for v in values for x in v]
    if all(v == values[0] for v in values):
        return values[0]
    raise ValueError(f"cannot join rollouts whose shared field differs: {values!r}")
