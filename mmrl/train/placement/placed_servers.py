"""The run's servers by role (docs/distributed.md#served-rollouts): the rollout servers of
`policy.rollout_engine: hf_server` (`placement.rollout`, or `rollout.servers` already running) and the
reward servers of `placement.reward`; the command that starts each one, the slot a client finds it by
(serving/server_directory.py), and the trainer's handle on its rollout servers.

A launcher that placed them (Ray) says so in the trainer ranks' environment (`distributed.launcher.
placed_by_launcher`); otherwise the run's main process starts them itself (local_servers.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from mmrl.config.placement import placed_rewards
from mmrl.config.sections import TrainConfig
from mmrl.serving.rollout_client import ServedRollouts
from mmrl.serving.server_directory import ServerSlot, address_file, node_address, slot_name
from mmrl.serving.weights_push import WeightsPush

ROLLOUT_ROLE = "rollout"


def reward_role(name: str) -> str:
    return f"reward-{name}"


def rollout_slots(cfg: TrainConfig) -> list[ServerSlot]:
    """The rollout servers, as the trainer finds them: the urls of `rollout.servers`, else the placed ones."""
    if cfg.rollout.servers:
        return [ServerSlot(f"{ROLLOUT_ROLE}-{i}", url=url) for i, url in enumerate(cfg.rollout.servers)]
    return [ServerSlot.placed(cfg.output_dir, slot_name(ROLLOUT_ROLE, i)) for i in range(cfg.placement.rollout)]


def reward_slots(cfg: TrainConfig) -> dict[str, list[ServerSlot]]:
    """The placed reward servers of each reward they score."""
    return {name: [ServerSlot.placed(cfg.output_dir, slot_name(reward_role(name), i)) for i in range(cfg.placement.reward)]
            for name in placed_rewards(cfg.placement, cfg.rewards)}


def rollout_server_command(recipe: str, overrides: list[str], announce: Path) -> list[str]:
    """`mmrl serve-rollout` of the run's recipe, on a free port, announcing itself at `announce`."""
    return [sys.executable, "-m", "mmrl", "serve-rollout", recipe, *overrides, "--host", "0.0.0.0", "--port", "0",
            "--announce", str(announce)]


def reward_server_command(name: str, reward_modules: list[str], announce: Path) -> list[str]:
    """`mmrl serve-reward NAME` (the recipe's reward modules imported first), on a free port, announcing
    itself at `announce`; the reward's arguments travel with each request."""
    modules = [arg for module in reward_modules for arg in ("--reward-module", module)]
    return [sys.executable, "-m", "mmrl", "serve-reward", name, *modules, "--host", "0.0.0.0", "--port", "0",
            "--announce", str(announce)]


def server_commands(cfg: TrainConfig, recipe: str, overrides: list[str]) -> dict[str, list[str]]:
    """Every placed server's name (ROLE-INDEX) and command, rollout servers first."""
    out = {}
    for i in range(0 if cfg.rollout.servers else cfg.placement.rollout):
        name = slot_name(ROLLOUT_ROLE, i)
        out[name] = rollout_server_command(recipe, overrides, address_file(cfg.output_dir, name))
    for reward in placed_rewards(cfg.placement, cfg.rewards):
        for i in range(cfg.placement.reward):
            name = slot_name(reward_role(reward), i)
            out[name] = reward_server_command(reward, cfg.reward_modules, address_file(cfg.output_dir, name))
    return out


def served_rollouts(cfg: TrainConfig, model: torch.nn.Module, version: int, is_main: bool) -> ServedRollouts:
    """The trainer process's handle on its rollout servers, the main process pushing the weights (those
    after `version` optimizer steps first). A request may be drawn by weights as old as the mode allows:
    sync none older than the step's; one_step_off and async `max_staleness` steps, async `weights_every - 1`
    more (the transfers it skips)."""
    ro = cfg.rollout
    max_behind = 0 if ro.mode == "sync" else ro.max_staleness + (ro.weights_every - 1 if ro.mode == "async" else 0)
    slots = rollout_slots(cfg)
    push = WeightsPush(slots, model, node_address()) if is_main else None
    rollouts = ServedRollouts(slots, max_behind, cfg.placement.server_timeout_s, push)
    rollouts.send_weights(model, version)
    return rollouts
