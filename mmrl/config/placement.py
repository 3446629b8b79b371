"""The recipe's ``launch:`` and ``placement:``: who starts the run's processes (this process and the ones
torchrun or accelerate launch started, or a Ray cluster), and how many of each role it places: trainer
ranks, rollout servers, reward servers (docs/distributed.md#several-machines-with-ray)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Launch = Literal["local", "ray"]
ROLES = ("trainer", "rollout", "reward")


@dataclass
class PlacementConfig:
    """How many processes of each role the run places, and what each needs."""

    trainer: int | None = field(default=None, metadata={"help": (
        "Trainer ranks (one process each, torchrun semantics: RANK, WORLD_SIZE, MASTER_ADDR; the same SPMD trainer "
        "on one or many). launch ray: the ranks Ray places (null: 1). launch local: null takes the processes the "
        "launcher started (torchrun --nproc_per_node); a number must be that number.")})
    rollout: int = field(default=0, metadata={"help": (
        "Rollout servers the run places (`mmrl serve-rollout`, policy.rollout_engine hf_server); 0: none (the "
        "trainer generates, or rollout.servers names running ones). launch local: started by the trainer's main "
        "process; launch ray: placed on the cluster and restarted when they die.")})
    reward: int = field(default=0, metadata={"help": (
        "Reward servers the run places for each reward of placement.rewards (`mmrl serve-reward NAME`), the reward's "
        "requests spread over them; 0: the rewards are scored in the trainer (or by their rewards.NAME.url).")})
    rewards: list[str] | None = field(default=None, metadata={"help": (
        "The rewards scored by the placed reward servers (names under `rewards`); null: every reward of the recipe "
        "that has no url, replay or server of its own.")})
    gpus: dict[str, float] = field(default_factory=dict, metadata={"help": (
        "launch ray: GPUs per process of each role, e.g. {trainer: 1, rollout: 1, reward: 0.5}; a role not named "
        "gets 1 where the cluster has GPUs, else 0.")})
    cpus: dict[str, float] = field(default_factory=dict, metadata={"help": (
        "launch ray: CPUs per process of each role, e.g. {rollout: 4}; a role not named gets 1.")})
    server_timeout_s: float = field(default=600.0, metadata={"help": (
        "Seconds to wait for a rollout or reward server (placed, or named by rollout.servers) to answer at the "
        "start, or to answer again after it died (restarted by its launcher), before the run stops; a dead rollout "
        "server's requests go to the live ones meanwhile.")})
    max_restarts: int = field(default=3, metadata={"help": (
        "launch ray: how many times a rollout or reward server that died is started again (its in-flight prompt "
        "groups are asked again, with the same seeds); then the run stops. A trainer rank that dies stops the run "
        "(resume=true continues from its newest checkpoint).")})


def placement_problems(placement: PlacementConfig, served: bool, has_servers: bool, rewards: dict) -> list[str]:
    """What is wrong with ``placement:`` against the recipe: `served` (a served rollout engine), `has_servers`
    (rollout.servers names running ones), `rewards` (name -> RewardSpec)."""
    problems = [f"placement.{role}={getattr(placement, role)} must be >= 0" for role in ("rollout", "reward")
                if getattr(placement, role) < 0]
    if placement.trainer is not None and placement.trainer < 1:
        problems.append(f"placement.trainer={placement.trainer} must be >= 1")
    if placement.server_timeout_s <= 0:
        problems.append(f"placement.server_timeout_s={placement.server_timeout_s} must be > 0")
    if placement.max_restarts < 0:
        problems.append(f"placement.max_restarts={placement.max_restarts} must be >= 0")
    for key in ("gpus", "cpus"):
        problems += [f"placement.{key}: {role!r} is not a role ({', '.join(ROLES)})"
                     for role in getattr(placement, key) if role not in ROLES]
        problems += [f"placement.{key}.{role}={n} must be >= 0" for role, n in getattr(placement, key).items() if n < 0]
    if placement.rollout and not served:
        problems.append(f"placement.rollout={placement.rollout} places rollout servers, but policy.rollout_engine "
                        "is not a served engine (hf_server)")
    if placement.rollout and has_servers:
        problems.append(f"placement.rollout={placement.rollout} and rollout.servers both name the rollout servers; "
                        "give one")
    if served and not placement.rollout and not has_servers:
        problems.append("policy.rollout_engine=hf_server needs rollout servers: placement.rollout: N (the run places "
                        "them) or rollout.servers: [urls] (running `mmrl serve-rollout`)")
    for name in placement.rewards or []:
        if name not in rewards:
            problems.append(f"placement.rewards: {name!r} is not one of the rewards {sorted(rewards)}")
        elif rewards[name].url or rewards[name].replay or rewards[name].server:
            problems.append(f"placement.rewards: {name!r} has its own rewards.{name}.url, replay or server")
    if placement.rewards is not None and not placement.reward:
        problems.append("placement.rewards names rewards, but placement.reward is 0 (no reward server placed)")
    return problems


def placed_rewards(placement: PlacementConfig, rewards: dict) -> list[str]:
    """The rewards the placed reward servers score (none where placement.reward is 0)."""
    if not placement.reward:
        return []
    if placement.rewards is not None:
        return list(placement.rewards)
    return [name for name, spec in rewards.items() if not (spec.url or spec.replay or spec.server)]
