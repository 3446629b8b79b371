"""The recipe's sections on a step's rollouts: how its prompts are drawn (`sampling:`), where and
when its rewards are scored (`scoring:`), and where its rollouts are generated (`rollout:`: in the
trainer, by a rollout worker one step off or asynchronously, or by rollout servers); and which
`policy.rollout_engine` values name served engines rather than the adapter's own (`served_engine`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# `policy.rollout_engine` values that the engine serves rather than the adapter: the adapter's rollouts
# run in rollout servers (`mmrl serve-rollout`), each building the policy with its own default engine
SERVED_ENGINES = ("hf_server",)


def served_engine(policy: dict[str, Any]) -> str | None:
    """The served engine a recipe's ``policy:`` section names (`SERVED_ENGINES`), or None."""
    engine = policy.get("rollout_engine")
    return engine if engine in SERVED_ENGINES else None


def adapter_policy(policy: dict[str, Any]) -> dict[str, Any]:
    """The ``policy:`` section as the adapter types it: a served engine's name left out (the servers, and
    the trainer's own evaluations, run the adapter's default engine)."""
    if served_engine(policy) is None:
        return policy
    return {k: v for k, v in policy.items() if k != "rollout_engine"}


@dataclass
class SamplingConfig:
    """How the prompts of a step are drawn (docs/methods.md, 'Prompt sampling')."""

    strategy: Literal["uniform", "variance"] = field(default="uniform", metadata={"stage": True, "help": (
        "How a step's prompts are drawn: uniform (epochs of a seeded shuffle) or variance (MMR1 Variance-Aware "
        "Sampling: prompts whose recent rewards vary are favoured).")})
    variance_mix: float = field(default=0.5, metadata={"stage": True, "help": (
        "With strategy variance: the fraction of prompts drawn by Variance Promotion Score; the rest are drawn "
        "uniformly.")})
    variance_window: int = field(default=4, metadata={"stage": True, "help": (
        "With strategy variance: how many recent rewards per prompt its outcome variance is taken over.")})
    variance_score: Literal["pass_rate", "variance"] = field(default="pass_rate", metadata={"help": (
        "strategy variance: a prompt's Variance Promotion Score from its recent outcomes: pass_rate = "
        "p(1 - p) of their mean p, outcomes in [0, 1] (MMR1's learnability, LengSicong/MMR1); variance = "
        "their population variance (mmrl's earlier rule; equal to p(1 - p) for 0/1 outcomes)")})
    variance_scaling: Literal["min_max", "none"] = field(default="min_max", metadata={"help": (
        "strategy variance: min_max = scores min-max scaled over the whole data set, (s - min) / (max - min "
        "+ 1e-8), before they become sampling weights (MMR1's trainer); none = raw scores (mmrl's earlier rule)")})
    variance_reward: str | None = field(default=None, metadata={"help": (
        "strategy variance: the reward (a name under `rewards`) whose values are the outcomes, e.g. a 0/1 "
        "accuracy reward as MMR1; null = the weighted reward total")})
    curriculum_column: str | None = field(default=None, metadata={"stage": True, "help": (
        "A numeric data-set column (difficulty): rows are walked easy -> hard by it, wrapping round (curriculum, "
        "SARI); null: off. Applies to strategy uniform.")})
    curriculum_descending: bool = field(default=False, metadata={"stage": True, "help": (
        "Walk the curriculum column from high to low values instead.")})
    dynamic: bool = field(default=False, metadata={"stage": True, "help": (
        "DAPO dynamic sampling: draw more prompts until the batch has prompts_per_step groups with non-zero "
        "reward variance (or dynamic_max_tries draws are used).")})
    dynamic_max_tries: int = field(default=4, metadata={"stage": True, "help": "With dynamic: the most draws per step."})


@dataclass
class ScoringConfig:
    """When a step's rollouts are scored (docs/rewards.md#scoring-while-generating)."""

    groups_per_call: int = field(default=0, metadata={"help": (
        "Prompt groups per generation call of a process's share of a draw (0: all of them in one call). Several "
        "calls let scoring.overlap score one call's groups while the next call generates, at the cost of smaller "
        "generation batches.")})
    overlap: bool = field(default=True, metadata={"help": (
        "Score each generation call's groups in a background thread while the next call generates; the rewards, "
        "advantages and loss are those of scoring after the whole rollout (a reward's value for a row must depend "
        "on its own group's rows only, as it already must on several processes). false: score after the whole "
        "rollout. Nothing to overlap with scoring.groups_per_call 0.")})
    where: Literal["auto", "trainer", "worker"] = field(default="auto", metadata={"help": (
        "With a rollout worker (rollout.mode one_step_off / async), which process scores its rollouts. worker: the "
        "worker builds the rewards too and scores each generation call in a thread while it generates the next; "
        "the rewards come with the rollouts, so neither generation nor the trainer waits for a slow (served) "
        "reward. trainer: the trainer scores each step's rollouts when it collects them. auto: worker when "
        "every reward is served (rewards.NAME.url or replay: a client, cheap to build twice), else trainer (an "
        "in-process reward model would load in both processes). The rewards are the same either way. "
        "rollout.mode sync: the trainer (worker is refused).")})


@dataclass
class RolloutConfig:
    """Who generates a step's rollouts, and when (docs/async.md#modes-rolloutmode)."""

    mode: Literal["sync", "one_step_off", "async"] = field(default="sync", metadata={"help": (
        "sync: each step's rollouts are generated with the weights it is about to update (by the trainer, or by "
        "rollout servers with policy.rollout_engine hf_server). one_step_off: "
        "a rollout worker (a process of its own, one torch thread) generates step k+1's rollouts while step k "
        "trains, from the weights it received after step k-1's update. async: the worker generates continuously, "
        "from the newest weights it has, up to rollout.max_staleness steps ahead of the trainer (a queue bounded "
        "at max_staleness + 1 steps of prompt groups). Both: any family (causal_lm, vlm, audio_lm: the hf engine; "
        "diffusion: policy.units steps; dlm: temperature above 0), whole weights or LoRA (the worker then takes the "
        "adapter's tensors alone after the first transfer), one process, no dynamic sampling, no stages; keep "
        "algorithm.rollout_correction tis or mis on (docs/async.md).")})
    max_staleness: int = field(default=1, metadata={"help": (
        "one_step_off (0 or 1) and async (0 or more): how many optimizer steps behind the trained weights the "
        "rollout worker's may be; async asks for the rollouts of up to this many steps ahead. 0: the worker "
        "waits for the newest weights (no overlap: exactly the synchronous run's rollouts, rewards and weights).")})
    weights_every: int = field(default=1, metadata={"help": (
        "async: send the worker the trained weights after every this many updates (fewer transfers; rows may "
        "then be up to max_staleness + weights_every - 1 steps old, see rollout.stale_rows). one_step_off: 1.")})
    servers: list[str] = field(default_factory=list, metadata={"help": (
        "policy.rollout_engine hf_server: the urls of rollout servers already running (`mmrl serve-rollout RECIPE`), "
        "each prompt-group request sent to the one with the fewest in flight; empty: the placement.rollout servers "
        "the run places itself (docs/distributed.md#served-rollouts).")})
    stale_rows: Literal["drop", "keep"] = field(default="drop", metadata={"help": (
        "async: what a step does with prompt groups drawn by weights more than max_staleness steps old (possible "
        "with weights_every > 1). drop: leave them out of the step (rollout/stale_dropped counts their rows); "
        "keep: train on them, weighted by algorithm.rollout_correction (tis or mis, required).")})
