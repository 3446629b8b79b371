"""The only code that names a distribution strategy: the `Strategy` interface and its registry
(`strategy`), one module per strategy (`ddp`, `fsdp`, `zero3`), and the launcher checks (`launcher`).
`build_strategy(cfg)` returns the recipe's."""

from __future__ import annotations

from mmrl.config.sections import TrainConfig
from mmrl.distributed import ddp, fsdp, zero3  # noqa: F401  (each registers its strategy)
from mmrl.distributed.strategy import STRATEGIES, Strategy


def build_strategy(cfg: TrainConfig) -> Strategy:
    """The strategy `distributed.strategy` names (a built-in one, or one a plugin registered)."""
    return STRATEGIES.get(cfg.distributed.strategy)(cfg)
