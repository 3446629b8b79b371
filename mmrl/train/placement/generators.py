"""Who generates a run's rollouts when the trainer does not: the rollout worker (`rollout.mode`
one_step_off / async, placement/rollout_worker.py) or the rollout servers (`policy.rollout_engine:
hf_server`, placement/placed_servers.py). Both take the same calls from the trainer (ask, has_asked,
asked_for, take_scored, send_weights, pop_metrics, stop)."""

from __future__ import annotations

import torch

from mmrl.config.rollouts import served_engine
from mmrl.config.sections import TrainConfig
from mmrl.serving.rollout_client import ServedRollouts
from mmrl.train.placement.placed_servers import served_rollouts
from mmrl.train.placement.rollout_worker import RolloutWorker

Generator = RolloutWorker | ServedRollouts


def start_generator(cfg: TrainConfig, model: torch.nn.Module, version: int, is_main: bool) -> Generator | None:
    """The run's generator, sent the weights of `model` (after `version` optimizer steps); None where the
    trainer generates (rollout.mode sync, no served engine)."""
    if served_engine(cfg.policy):
        return served_rollouts(cfg, model, version, is_main)
    if cfg.rollout.mode != "sync":
        return RolloutWorker(cfg, model, version)
    return None
