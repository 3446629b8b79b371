"""Data parallelism (`distributed.strategy: ddp`, the default): every process holds the whole model
and its AdamW state, runs its own prompts, and the gradients are averaged on each step's last
backward (`accelerate` wraps the model in DistributedDataParallel under a multi-process launch; one
process trains the model as it is). Everything is `Strategy`'s default behaviour."""

from __future__ import annotations

from mmrl.distributed.strategy import STRATEGIES, Strategy


@STRATEGIES.register("ddp")
class DataParallel(Strategy):
    """Whole model on every process, gradients averaged."""
