"""The rows a unit is scored on. A diffusion unit (a denoising step, or a re-noised sample) is
forwarded under grad only on the rows of a micro-batch whose `unit_mask` trains it, and its
values go back to the micro-batch's rows with 0 on the others (every consumer masks them: the
loss, the KL, the ratio, the rollout correction, the metrics). Shared by the step units
(`step_units.py`) and the forward-process units (`forward_process.py`), with the rows' slice of
the prompt conditioning a rollout keeps in its extras.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout

Reference = Callable[[], AbstractContextManager[nn.Module]]  # enters a context yielding the reference model


def unit_rows(batch: Rollout, units: slice, sharded: bool) -> list[tuple[int, Tensor]]:
    """(unit k, the rows whose `unit_mask` trains k) for each unit of `units`: the training forward
    of a unit takes those rows only. A unit no row trains takes none, except the first unit where
    none of them is trained (the backward needs a graph) and every unit where the model is
    `sharded` (every process runs as many forwards): there the first row, its value masked out."""
    ks = list(range(batch.num_units))[units]
    rows = [batch.unit_mask[:, k].nonzero().flatten() for k in ks]
    first = torch.tensor([0])
    if sharded:
        rows = [r if len(r) else first for r in rows]
    elif ks and not any(len(r) for r in rows):
        rows[0] = first
    return list(zip(ks, rows))


def on_rows(values: Tensor, rows: Tensor, n: int) -> Tensor:
    """[n, ...]: `values` [r, ...] at `rows`, 0 at the rows that do not train the unit."""
    if len(rows) == n:  # the rows are sorted: every row
        return values
    return values.new_zeros(n, *values.shape[1:]).index_copy(0, rows.to(values.device), values)


def untrained(device: torch.device, n: int, *shape: int) -> Tensor:
    """[n, *shape] zeros: a unit no row of the micro-batch trains (never forwarded)."""
    return torch.zeros(n, *shape, device=device)


def rows_conditioning(batch: Rollout, rows: Tensor, device: torch.device,
                      prefixes: Sequence[str] = ("pos/", "neg/")) -> dict[str, Tensor]:
    """The prompt conditioning of rows `rows` (the extras under `prefixes`), on `device`."""
    return {key: v[rows].to(device) for key, v in batch.extras.items() if key.startswith(tuple(prefixes))}
