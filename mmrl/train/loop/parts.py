"""Building a run's parts from its plan: the rewards and data of a stage (validated before any model
loads), the policy placed by the strategy, LoRA, the frozen reference, the optimizer and its
learning-rate schedule."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mmrl.config.parse import ConfigError
from mmrl.config.sections import TrainConfig
from mmrl.core.lora import with_lora
from mmrl.core.policy import Policy, build_policy
from mmrl.core.regularisers import regulariser_needs
from mmrl.core.scoring import ENGINE_COLUMNS, ColumnBoundReward, RewardFn, column_checks, column_name_problems
from mmrl.data import Rows, load_data, reward_columns_needed
from mmrl.data.sampler import PromptSampler
from mmrl.distributed.strategy import Strategy
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS
from mmrl.serving.teacher_client import ServedTeacher
from mmrl.train.loop.benchmark_pass import PeriodicBench
from mmrl.train.loop.collect import StageInputs
from mmrl.train.loop.score_pair import ScorePair, build_scores
from mmrl.train.loop.teachers import Teachers
from mmrl.train.placement.reward_binding import bound_rewards
from mmrl.train.plan.stages import Stage, StagePlan
from mmrl.train.plan.teacher import is_served, teacher_column_check, teacher_field, teacher_policy_config


def load_validated_data(cfg: TrainConfig, policy_cfg: Any, reward_fns: dict[str, RewardFn],
                        warm_start: bool = False) -> tuple[Rows, Rows]:
    """The data set, validated before any model loads: prompt column (and the adapter's
    `prompt_check`, e.g. a chat template for message lists), every column a reward needs
    (through its column bindings; those the adapter's rollouts give excepted) and the values rewards
    check, the columns the adapter requires and its media columns, with `warm_start` the warm
    start's target column in the training rows; reward bindings that clash with a data column, and
    columns a reward's arguments name that the rows will not have (`column_name_problems`), are errors."""
    adapter = ADAPTERS.get(cfg.task)
    provided = (*ENGINE_COLUMNS, *adapter.rollout_columns(policy_cfg))
    bindings = {name: spec.columns for name, spec in cfg.rewards.items()}
    required = {**reward_columns_needed(reward_fns, bindings, provided), **adapter.required_columns(policy_cfg)}
    values = column_checks({name: (spec.args, spec.columns) for name, spec in cfg.rewards.items()})
    prompt_check = adapter.prompt_check(policy_cfg)
    if prompt_check is not None:
        values = [*values, (cfg.data.prompt_column, prompt_check)]
    ws = cfg.warm_start
    target = {ws.target_column: f"the warm start, warm_start.target_column; warm_start.steps={ws.steps}, and "
                                "warm_start.steps=0 trains without it"} if warm_start and ws.steps > 0 else {}
    distill = cfg.algorithm.distill
    if distill.teacher_column is not None:  # the rows' teachers, checked as a reward's columns are
        target[distill.teacher_column] = "algorithm.distill.teacher_column (each row's teacher)"
        values = [*values, (distill.teacher_column, teacher_column_check(distill))]
    train, held_out = load_data(cfg.data, adapter.media_columns(policy_cfg), required, values, target)
    columns = list(train[0]) if len(train) else []
    for fn in reward_fns.values():
        bound = fn if isinstance(fn, ColumnBoundReward) else getattr(fn, "func", None)
        if isinstance(bound, ColumnBoundReward):
            bound.check(columns)
    problems = [p for name, spec in cfg.rewards.items()  # the columns a reward sees: its bound arguments too
                for p in column_name_problems({name: spec.args}, [*columns, *provided, *spec.columns])]
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          "\n  ".join([f"{len(problems)} problems of the rewards with the data:", *problems]))
    return train, held_out


def stage_inputs(stage: Stage, plan: StagePlan, reward_fns=None, reward_weights=None,
                 warm_start: bool = False, held_out: bool = False) -> StageInputs:
    """A stage's rewards (bound here unless given), data (with the warm start's target column where
    `warm_start`; with `held_out`, refused without held-out rows), a fresh prompt sampler over it and its
    ``eval.bench`` (its rows read before any model loads)."""
    if reward_fns is None:
        reward_fns, reward_weights = bound_rewards(stage.config)
    cfg = stage.config
    train, evaluated = load_validated_data(cfg, stage.policy, reward_fns, warm_start)
    if held_out and not len(evaluated):
        raise UserError(f"eval: the data ({cfg.data.path or cfg.data.name}) has no held-out rows to score; "
                        f"set data.eval_path (a held-out file, or a data set with data.eval_split)")
    bench = cfg.eval.bench
    return StageInputs(cfg, reward_fns, reward_weights, train, evaluated,
                       PromptSampler(train, cfg.sampling, plan.sampler_seed(stage)),
                       PeriodicBench(bench) if bench is not None else None)


@dataclass
class Parts:
    """The policy and what trains it, as the strategy prepared them."""

    policy: Policy
    model: nn.Module               # the trained module (the strategy's wrapper around policy.model)
    optimizer: torch.optim.Optimizer
    scheduler: Any                 # transformers' LR scheduler over `optimizer`
    reference: nn.Module | None    # a frozen copy for the KL, None without one (or with LoRA: adapter off)
    teachers: Teachers | None = None  # the frozen distillation teachers (algorithm.distill), or None
    scores: ScorePair | None = None  # distribution matching's real and fake scores, or None


def build_parts(stage: Stage, plan: StagePlan, strategy: Strategy) -> Parts:
    """The policy (seeded by the recipe, so identical on every process), placed by the strategy, with
    LoRA, the reference a regulariser asks for, AdamW and the schedule, prepared by the strategy."""
    cfg = stage.config
    served = served_teachers(plan)  # each asked whether it answers, before any model loads
    torch.manual_seed(cfg.seed)  # model construction and LoRA init are identical on every process
    policy = build_policy(cfg, stage.policy)
    policy.prompt_column = cfg.data.prompt_column
    if cfg.policy.get("device") is None:
        policy.model.to(strategy.acc.device)
    strategy.place(policy.model)
    policy.use_parallel(strategy.view())
    scores = build_scores(cfg, policy, strategy.acc.process_index)  # before LoRA
    policy.model = with_lora(policy.model, cfg.optim.lora)  # as the rollout worker wraps its copy
    reference = None
    if any(regulariser_needs(s.config.algorithm, "reference") for s in plan.stages) and cfg.optim.lora.r == 0:
        reference = strategy.frozen(copy.deepcopy(policy.model).eval().requires_grad_(False))
    strategy.shard(policy.model)
    policy.model.train()
    optimizer = _optimizer(policy, cfg)
    from transformers import get_scheduler
    scheduler = get_scheduler(cfg.optim.schedule, optimizer, num_warmup_steps=cfg.optim.warmup_steps,
                              num_training_steps=max(cfg.max_steps, 1))
    if policy.partial_backward:
        strategy.allow_partial_backward()
    model, optimizer = strategy.prepare(policy.model, optimizer)
    strategy.acc.register_for_checkpointing(scheduler)
    return Parts(policy, model, optimizer, scheduler, reference, build_teachers(plan, strategy, served), scores)


def distill_config(plan: StagePlan) -> TrainConfig | None:
    """The first stage's config that distils (the run's teachers are built from it), None if none does."""
    return next((s.config for s in plan.stages if s.config.algorithm.distill.active), None)


def served_teachers(plan: StagePlan) -> dict[str, ServedTeacher]:
    """The teachers behind `mmrl serve-teacher` by name ({url: ...}), each checked to answer."""
    cfg = distill_config(plan)
    if cfg is None:
        return {}
    distill = cfg.algorithm.distill
    served = {name: ServedTeacher(keys["url"], teacher_field(distill, name))
              for name, keys in distill.named_teachers.items() if is_served(keys)}
    for teacher in served.values():
        teacher.check()
    return served


def build_teachers(plan: StagePlan, strategy: Strategy, served: dict[str, ServedTeacher]) -> Teachers | None:
    """The frozen teachers of on-policy distillation (`algorithm.distill.teacher` or `teachers`): the
    `served` ones, and the student's adapter built from each other teacher's policy section, of which
    the engine keeps the module it scores with."""
    cfg = distill_config(plan)
    if cfg is None:
        return None
    modules: dict[str, nn.Module | ServedTeacher] = {}
    for name in cfg.algorithm.distill.named_teachers:
        if name in served:
            modules[name] = served[name]
            continue
        teacher = build_policy(cfg, teacher_policy_config(cfg, name))
        if cfg.policy.get("device") is None:
            teacher.model.to(strategy.acc.device)
        modules[name] = strategy.frozen(teacher.model.eval().requires_grad_(False))
    return Teachers(modules, cfg.algorithm.distill.teacher_column)


def _optimizer(policy: Policy, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the policy's parameter groups (`Policy.parameter_groups`; by default one group of every
    trained parameter at `optim.lr`); each group keeps its rate relative to `optim.lr` as `lr_scale`."""
    groups = policy.parameter_groups(policy.model, cfg.optim.lr)
    if groups is None:
        groups = [{"params": [p for p in policy.model.parameters() if p.requires_grad], "lr": cfg.optim.lr}]
    groups = [{**g, "lr_scale": g["lr"] / cfg.optim.lr if cfg.optim.lr else 1.0} for g in groups if g["params"]]
    params = [p for g in groups for p in g["params"]]
    # the fused kernel (CPU and CUDA) is several times faster than the per-tensor loop
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                             betas=tuple(cfg.optim.betas), fused=fused or None)


def set_base_lr(optimizer: torch.optim.Optimizer, scheduler, lr: float) -> None:
    """A new base learning rate (a stage's, or a resume's), each parameter group at its own `lr_scale` of
    it (`Policy.parameter_groups`); the schedule's factor at this step carries on."""
    bases = [lr * group.get("lr_scale", 1.0) for group in optimizer.param_groups]
    for group, old, new in zip(optimizer.param_groups, scheduler.base_lrs, bases):
        group["lr"] = group["lr"] * new / old if old else new
        group["initial_lr"] = new
    scheduler.base_lrs = bases


def take_optimizer_settings(optimizer: torch.optim.Optimizer, scheduler, cfg: TrainConfig) -> None:
    """After loading a checkpoint: the recipe's AdamW settings, not the checkpoint's (they differ only
    with resume_changes=allow)."""
    for group in optimizer.param_groups:
        group["weight_decay"], group["betas"] = cfg.optim.weight_decay, tuple(cfg.optim.betas)
    bases = [cfg.optim.lr * group.get("lr_scale", 1.0) for group in optimizer.param_groups]
    if any(base != want for base, want in zip(scheduler.base_lrs, bases)):
        set_base_lr(optimizer, scheduler, cfg.optim.lr)
