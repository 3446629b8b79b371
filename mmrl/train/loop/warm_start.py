"""The supervised warm start (`warm_start.*`): a few steps of the adapter's supervised loss on the data
set's targets before RL, with its own AdamW and schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from mmrl.config.sections import TrainConfig
from mmrl.core.policy import Policy
from mmrl.core.seeding import derive_seed
from mmrl.train.reporting.tracking import Progress

WARM_START_SALT = 0xA11CE


def warm_start(cfg: TrainConfig, policy: Policy, model: nn.Module, rows, show_progress: bool) -> float:
    """Train `model` (the unwrapped policy module) for `warm_start.steps` on batches of `rows` drawn
    from a seed of the run's; returns the last loss (NaN when there is no warm start)."""
    ws = cfg.warm_start
    if ws.steps <= 0:
        return math.nan
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=ws.lr)
    from transformers import get_scheduler
    scheduler = get_scheduler("cosine" if ws.schedule == "cosine" else "constant_with_warmup", optimizer,
                              num_warmup_steps=ws.warmup_steps, num_training_steps=ws.steps)
    generator = torch.Generator().manual_seed(derive_seed(cfg.seed, WARM_START_SALT))
    loss = torch.zeros(())
    progress = Progress(ws.steps, enabled=cfg.logging.progress and show_progress, desc="warm start")
    for step in range(1, ws.steps + 1):
        pick = torch.randint(len(rows), (ws.batch_size,), generator=generator).tolist()
        loss = policy.supervised_loss(model, [rows[i] for i in pick], ws.target_column)
        loss.backward()
        if ws.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, ws.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        progress.update(step, {"loss": loss.item()})
    progress.close()
    return loss.item()
