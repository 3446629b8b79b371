"""The whole recipe, checked before any model, data set or reward model loads.

`validate(cfg)` reports every problem at once, each naming its dotted key and value:
- the ``policy:`` section against the chosen adapter's own ``Config`` dataclass, and local model
  paths that do not exist;
- each reward's ``args`` against the reward function's signature (an argument it does not name
  is an error even when it takes ``**kwargs``, with the closest name as a suggestion) and the
  values its ``Literal`` annotations allow, the kinds of completion it scores against the
  adapter's, its urls' form;
- every registry name (task, data set, reward, estimator, objective, aggregation, KL estimator,
  LR schedule, reporter);
- the range of every number in `RANGES` (group size >= 2, positive counts and rates, ...).
The checks of each concern are modules of their own: range_checks, registry_names,
method_checks, reward_checks, learning_rates (a rate above optim.max_lr refused, a large one warned of).
The structure of the recipe (unknown keys, types) is checked when it is parsed
(`mmrl.config.from_dict`), for every dataclass field whoever adds it.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path

from mmrl.config.parse import ConfigError, from_dict
from mmrl.config.placement import placed_rewards
from mmrl.config.rollouts import adapter_policy
from mmrl.config.sections import TrainConfig
from mmrl.core.objectives import OBJECTIVES
from mmrl.core.regularisers import regulariser_needs
from mmrl.core.scoring import REWARDS, get_reward
from mmrl.data.sources import is_hub_id
from mmrl.distributed import STRATEGIES
from mmrl.registry import ADAPTERS, BENCHMARKS, DATASETS, import_user_module, load_plugins
from mmrl.serving.remote_reward import sends_own_requests
from mmrl.train.placement.rollout_modes import rollout_mode_problems
from mmrl.train.plan.learning_rates import check_learning_rates
from mmrl.train.plan.method_checks import (check_algorithm, check_distribution_matching, check_dppo, check_ratio_norm,
                                          check_unit_terms)
from mmrl.train.plan.range_checks import check_ranges
from mmrl.train.plan.registry_names import check_name, unknown_name
from mmrl.train.plan.reward_checks import check_rewards
from mmrl.train.plan.stages import StagePlan
from mmrl.train.plan.teacher import check_distill
from mmrl.train.reporting.tracking import REPORTER_PACKAGES, REPORTERS

LOCAL_PATH_PREFIXES = ("/", "./", "../", "~")
logger = logging.getLogger(__name__)


def _check_policy(cfg: TrainConfig, problems: list[str]) -> str | None:
    """The ``policy:`` section's problems; returns what the adapter's completions are (None: not known)."""
    if not check_name(problems, ADAPTERS, "task", cfg.task):
        return None
    adapter = ADAPTERS.get(cfg.task)
    try:
        policy_cfg = from_dict(adapter.Config, adapter_policy(cfg.policy), "policy")
    except ConfigError as e:
        problems += str(e).splitlines()
        return None
    except (TypeError, ValueError) as e:
        problems.append(f"policy: {e}")
        return None
    for name, value in vars(policy_cfg).items():
        if isinstance(value, str) and value.startswith(LOCAL_PATH_PREFIXES) and not Path(value).expanduser().exists():
            problems.append(f"policy.{name}: local path {value!r} does not exist")
    check = getattr(adapter, "config_problems", None)  # an adapter's own checks that need no model
    if check is not None:
        problems += check(policy_cfg)
    if cfg.optim.lora.r > 0 and adapter.engine_lora_refused:
        problems.append(f"optim.lora.r={cfg.optim.lora.r}: task {cfg.task} {adapter.engine_lora_refused}")
    group_check = getattr(adapter, "group_size_problems", None)
    if group_check is not None:
        problems += group_check(policy_cfg, cfg.algorithm.group_size)
    if cfg.algorithm.objective in OBJECTIVES.names():
        check_unit_terms(cfg, adapter.unit_terms(policy_cfg), problems)
    if cfg.algorithm.ratio_norm != "none":
        check_ratio_norm(cfg, adapter.step_scale_problem(policy_cfg), problems)
    if cfg.algorithm.trust_region == "dppo":
        check_dppo(cfg, adapter.divergence_problem(policy_cfg), problems)
    if cfg.algorithm.distill.active:
        check_distill(cfg, adapter, policy_cfg, problems)
    if cfg.algorithm.distribution_matching.enabled:
        check_distribution_matching(cfg, adapter.score_problem(policy_cfg), problems)
    return adapter.output_kind(policy_cfg)


def _check_optim(cfg: TrainConfig, problems: list[str], num_processes: int) -> None:
    from transformers import SchedulerType
    schedules = [s.value for s in SchedulerType]
    if cfg.optim.schedule not in schedules:
        problems.append(unknown_name("LR schedule", "optim.schedule", cfg.optim.schedule, schedules))
    pps = cfg.optim.prompts_per_step
    if pps >= 1 and pps % num_processes:
        problems.append(f"optim.prompts_per_step={pps} must be a multiple of the {num_processes} processes")


def _stage_plan(cfg: TrainConfig, problems: list[str], num_processes: int,
                output_kind: str | None) -> StagePlan | None:
    """The run's stage plan, each stage's settings checked as the recipe's (ranges, prompts per step
    against the processes, rewards of its own); None where the recipe's own problems, already
    reported, keep it from being built."""
    if not cfg.stages and problems:
        return None
    plan = StagePlan(cfg)
    for stage in plan.stages if cfg.stages else ():
        found: list[str] = []
        check_ranges(stage.config, found)
        if stage.config.rewards != cfg.rewards:
            check_rewards(stage.config, found, output_kind)
        pps = stage.config.optim.prompts_per_step
        if pps >= 1 and pps % num_processes:
            found.append(f"optim.prompts_per_step={pps} must be a multiple of the {num_processes} processes")
        problems.extend(f"stages[{stage.index}].{p}" for p in found if p not in problems)
    return plan


def _check_data_and_logging(cfg: TrainConfig, problems: list[str]) -> None:
    data = cfg.data
    if (data.name is None) == (data.path is None):
        problems.append(f"data: give exactly one of data.name (a registered data set) or data.path "
                        f"(got name={data.name!r}, path={data.path!r})")
    if data.name is not None:
        check_name(problems, DATASETS, "data.name", data.name)
    for key in ("path", "eval_path"):
        value = getattr(data, key, None)
        if isinstance(value, str) and ":" not in value and not Path(value).expanduser().exists() \
                and not is_hub_id(value):  # a hub id is loaded with the data, before any model
            problems.append(f"data.{key}: {value!r} does not exist")
    bench = cfg.eval.bench
    if bench is not None and check_name(problems, BENCHMARKS, "eval.bench.name", bench.name):
        unknown = sorted(set(bench.options) - set(BENCHMARKS.get(bench.name).options))
        problems += [f"eval.bench.options: benchmark {bench.name!r} has no option {unknown[0]!r}"] if unknown else []
    if bench is not None and bench.num_prompts < 1:
        problems.append(f"eval.bench.num_prompts={bench.num_prompts} must be >= 1")
    report_to = [cfg.logging.report_to] if isinstance(cfg.logging.report_to, str) else cfg.logging.report_to
    for r in report_to:
        if r not in REPORTERS:
            problems.append(f"logging.report_to: {r!r} is not one of {list(REPORTERS)}")
        elif r in REPORTER_PACKAGES and importlib.util.find_spec(REPORTER_PACKAGES[r]) is None:
            problems.append(f"logging.report_to: {r!r} needs the {REPORTER_PACKAGES[r]!r} package, which is not "
                            f"installed; install it or leave {r!r} out")


def _check_distributed(cfg: TrainConfig, problems: list[str], num_processes: int) -> None:
    dist = cfg.distributed
    if dist.shard_modules is not None and not dist.shard_modules:
        problems.append("distributed.shard_modules=[]: name at least one block class, or null for the model's own")
    if check_name(problems, STRATEGIES, "distributed.strategy", dist.strategy):
        problems += STRATEGIES.get(dist.strategy).config_problems(cfg)
    vllm = cfg.policy.get("vllm") or {}
    tensor_parallel = vllm.get("tensor_parallel_size", 1) if isinstance(vllm, dict) else 1
    if (cfg.policy.get("rollout_engine") == "vllm" and num_processes > 1 and isinstance(tensor_parallel, int)
            and tensor_parallel > 1):
        problems.append(f"policy.vllm.tensor_parallel_size={tensor_parallel} with {num_processes} processes: each "
                        "process drives a vLLM engine of its own on its own prompts, so an engine cannot span "
                        "processes; use tensor_parallel_size 1 under a multi-process launch")
    if cfg.algorithm.distribution_matching.enabled and num_processes > 1:
        problems.append(f"algorithm.distribution_matching.enabled=true trains its fake score in one process; this "
                        f"run has {num_processes}")


def _check_placement(cfg: TrainConfig, problems: list[str], num_processes: int) -> None:
    """The trainer ranks the recipe places against the processes that joined (a launcher placed as many),
    and the placed reward servers' rewards (`mmrl serve-reward` serves registered rewards, not judges)."""
    trainer = cfg.placement.trainer
    if trainer is not None and trainer >= 1 and trainer != num_processes:
        problems.append(f"placement.trainer={trainer} but {num_processes} trainer process(es) joined; launch as many "
                        f"(torchrun --nproc_per_node {trainer}, or launch ray), or set placement.trainer=null")
    for name in placed_rewards(cfg.placement, cfg.rewards):
        if name in REWARDS and sends_own_requests(get_reward(name)):
            problems.append(f"placement.rewards: {name!r} is a judge, which speaks to an OpenAI-compatible server "
                            f"(rewards.{name}.url), not to `mmrl serve-reward`")


def _check_warm_start(cfg: TrainConfig, problems: list[str]) -> None:
    """After a warm start the KL's reference is the warm-started model, a copy of the policy's weights
    (Trainer.reference_from_policy), not an adapter switched off (the strategies say what they keep)."""
    if cfg.warm_start.steps <= 0 or not regulariser_needs(cfg.algorithm, "reference"):
        return
    if cfg.optim.lora.r > 0:
        problems.append(f"warm_start.steps={cfg.warm_start.steps} with optim.lora.r={cfg.optim.lora.r} and a KL "
                        f"(algorithm.beta={cfg.algorithm.beta}): the LoRA reference is the adapter switched off, "
                        "the model before the warm start; train without LoRA, or without the KL")


def validate(cfg: TrainConfig, num_processes: int = 1, warn: Callable[[str], None] | None = None) -> StagePlan:
    """Raise one `ConfigError` listing every problem of `cfg`, or return the run's plan: its stages,
    each with its ``policy:`` section typed by the adapter (the only place it is typed). Imports the
    plugins and the recipe's `reward_modules` (to know their names), loads no model, data set or
    reward model. `warn`: where what may be a mistake but trains goes (default: this module's logger)."""
    load_plugins()
    problems: list[str] = []
    for module in cfg.reward_modules:
        try:
            import_user_module(module, "reward_modules")
        except FileNotFoundError as e:
            problems.append(str(e))
        except ImportError as e:
            problems.append(f"reward_modules: {module!r}: {e}")
    output_kind = _check_policy(cfg, problems)
    check_rewards(cfg, problems, output_kind)
    check_algorithm(cfg, problems)
    _check_optim(cfg, problems, num_processes)
    _check_data_and_logging(cfg, problems)
    _check_distributed(cfg, problems, num_processes)
    _check_placement(cfg, problems, num_processes)
    _check_warm_start(cfg, problems)
    check_ranges(cfg, problems)
    problems += rollout_mode_problems(cfg, num_processes)
    plan = _stage_plan(cfg, problems, num_processes, output_kind)
    stages = [stage.config for stage in plan.stages] if plan is not None and cfg.stages else []
    check_learning_rates(cfg, stages, problems, warn or logger.warning)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems in the recipe:\n  " + "\n  ".join(problems))
    return plan
