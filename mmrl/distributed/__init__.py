"""The only code that names a distribution strategy: the `Strategy` interface and its registry
(`strategy`), one module per strategy (`ddp`, `fsdp`, `zero3`), and the launcher checks (`launcher`).
`build_strategy(cfg)` returns the recipe's; `state_shares` what its processes keep (the memory plan)."""

from __future__ import annotations

from mmrl.config.sections import DistributedConfig, TrainConfig
from mmrl.distributed import ddp, fsdp, zero3  # noqa: F401  (each registers its strategy)
from mmrl.distributed.strategy import STRATEGIES, StateShares, Strategy


def build_strategy(cfg: TrainConfig) -> Strategy:
    """The strategy `distributed.strategy` names (a built-in one, or one a plugin registered)."""
    return STRATEGIES.get(cfg.distributed.strategy)(cfg)


def state_shares(cfg: DistributedConfig, processes: int) -> StateShares:
    """What one of `processes` processes of `cfg.strategy` keeps on its device (`StateShares`)."""
    return STRATEGIES.get(cfg.strategy).state_shares(cfg, processes)
