"""Where a diffusion rollout's randomness comes from. Group g depends on its prompt and seeds[g]
only (`Policy.rollout`): every draw comes from a generator of its own, seeded from the group's
seed through a salt, never from the global RNG. The group shares one initial noise (DanceGRPO);
each row draws its step noise from its row seed (NOISE_SALT and its index in the group); under
DiffusionNFT's forward process each row starts from noise of its own and re-noises its sample
with noise seeded alike (FORWARD_SALT). A row's trained steps (STEPS_SALT) and a group's random
window (WINDOW_SALT) are drawn from seeds of their own.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from mmrl.core.seeding import derive_seed

from .family import Family

NOISE_SALT, STEPS_SALT, FORWARD_SALT, WINDOW_SALT = 0x5DE, 0x57E, 0xF0D, 0x3D0


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with `seed`."""
    return torch.Generator().manual_seed(seed)


def row_seeds(seeds: Sequence[int], group_size: int) -> list[int]:
    """The seed of each row, group by group: (group seed, NOISE_SALT, index in the group)."""
    return [derive_seed(s, NOISE_SALT, j) for s in seeds for j in range(group_size)]


def group_noise(family: Family, cfg: Any, seed: int, group_size: int) -> Tensor:
    """[group_size, ...] CPU: the family's initial noise drawn from `seed`, shared by the group."""
    noise = family.noise(torch.Generator().manual_seed(int(seed)), cfg.height, cfg.width)
    return noise.expand(group_size, *noise.shape[1:])


def initial_noise(family: Family, cfg: Any, seeds: Sequence[int], group_size: int, own_noise: bool) -> Tensor:
    """[N, ...] CPU: one noise per group, or with `own_noise` (the forward process: a deterministic
    sampler would otherwise give a group of equal samples) one per row, from (row seed, FORWARD_SALT)."""
    if own_noise:
        return torch.cat([group_noise(family, cfg, derive_seed(r, FORWARD_SALT), 1) for r in row_seeds(seeds, group_size)])
    return torch.cat([group_noise(family, cfg, s, group_size) for s in seeds])
