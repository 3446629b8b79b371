"""Chunk-GRPO chunk boundaries from the relative L1 change of the latents (Luo et al.,
'Sample by Step, Optimize by Chunk'): steps whose latents change alike belong together.

    c_k = mean over rollouts of ||x_{k+1} - x_k||_1 / ||x_k||_1            (one value per step)
The steps are cut into `num_chunks` consecutive chunks of (as nearly as possible) equal total
change: chunk boundaries where the cumulative change crosses j / num_chunks of its total (our
reading of the paper, which gives no code). The sizes go to `algorithm.chunks` with
`algorithm.ratio_level: chunk` (one importance ratio per chunk) and, if chunks are sampled, to
`policy.schedule.sizes`.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def relative_l1_change(latents: Tensor) -> Tensor:
    """c [U] from trajectories [N, U + 1, ...]."""
    x = latents.float().flatten(2)
    change = (x[:, 1:] - x[:, :-1]).abs().sum(-1) / x[:, :-1].abs().sum(-1).clamp(min=1e-12)
    return change.mean(0)


def chunk_sizes(change: Tensor, num_chunks: int) -> list[int]:
    """Sizes of `num_chunks` consecutive chunks of about equal total change (each >= 1 step)."""
    u = len(change)
    if not 1 <= num_chunks <= u:
        raise ValueError(f"num_chunks={num_chunks} must be between 1 and the {u} steps")
    cum = torch.cumsum(change.double(), 0) / change.double().sum().clamp(min=1e-12)
    cuts, last = [], 0
    for j in range(1, num_chunks):
        # the first step at which the cumulative change reaches j / num_chunks, leaving room for the rest
        k = int(torch.searchsorted(cum, torch.tensor(j / num_chunks, dtype=torch.float64))) + 1
        k = min(max(k, last + 1), u - (num_chunks - j))
        cuts.append(k)
        last = k
    bounds = [0] + cuts + [u]
    return [b - a for a, b in zip(bounds[:-1], bounds[1:])]


@torch.no_grad()
def calibrate_chunks(policy, prompts: Sequence, num_chunks: int, group_size: int = 4, seed: int = 0) -> list[int]:
    """Chunk sizes for `policy` from the latent change of rollouts of `prompts`."""
    batch = policy.rollout(list(prompts), group_size, [seed + i for i in range(len(prompts))])
    return chunk_sizes(relative_l1_change(batch.extras["latents"]), num_chunks)
