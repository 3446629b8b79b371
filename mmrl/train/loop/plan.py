"""The whole recipe, checked before any model, data set or reward model loads.

`validate(cfg)` reports every problem at once, each naming its dotted key and value:
- the ``policy:`` section against the chosen adapter's own ``Config`` dataclass, and local model
  paths that do not exist;
- each reward's ``args`` against the reward function's signature (an argument it does not name
  is an error even when it takes ``**kwargs``, with the closest name as a suggestion);
- every registry name (task, data set, reward, estimator, objective, aggregation, KL estimator,
  LR schedule, reporter);
- the range of every number in `RANGES` (group size >= 2, positive counts and rates, ...).
The structure of the recipe (unknown keys, types) is checked when it is parsed
(`mmrl.config.from_dict`), for every dataclass field whoever adds it.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mmrl.config.parse import ConfigError, from_dict
from mmrl.config.sections import TrainConfig
from mmrl.core.estimators import ADVANTAGE_ESTIMATORS
from mmrl.core.objectives import AGGREGATIONS, OBJECTIVES
from mmrl.core.regularisers import CLOSED_FORM_KL, KL_ESTIMATORS, regulariser_needs
from mmrl.core.plain_rewards import is_plain_reward
from mmrl.core.scoring import HOW_TO_NAME, REWARDS, get_reward
from mmrl.distributed import STRATEGIES
from mmrl.registry import ADAPTERS, DATASETS, Registry, import_user_module, load_plugins
from mmrl.serving.remote_reward import remote_problems
from mmrl.train.placement.rollout_modes import rollout_mode_problems
from mmrl.train.loop.stages import StagePlan
from mmrl.train.reporting.tracking import REPORTER_PACKAGES, REPORTERS

# dotted key -> (rule, what the rule says); a value of None (an unset optional) is not checked
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {}


def _rule(keys: str, test: Callable[[Any], bool], text: str) -> None:
    for key in keys.split():
        RANGES[key] = (test, text)


_rule("algorithm.group_size", lambda v: v >= 2, "must be >= 2 (advantages compare the rollouts of a group)")


_rule("algorithm.mu optim.prompts_per_step optim.micro_batch_size max_steps max_bad_steps eval.max_prompts "
      "eval.group_size warm_start.batch_size sampling.variance_window sampling.dynamic_max_tries "
      "save_total_limit algorithm.max_units", lambda v: v >= 1, "must be >= 1")


_rule("optim.lr save_every eval.every logging.plot_every logging.print_every warm_start.steps warm_start.warmup_steps optim.warmup_steps "
      "optim.lora.r seed scoring.groups_per_call algorithm.eps algorithm.eps_low "
      "algorithm.eps_high algorithm.beta algorithm.llds_coef algorithm.prune_threshold optim.weight_decay "
      "algorithm.train_extremes",
      lambda v: v >= 0, "must be >= 0")


_rule("warm_start.lr optim.max_grad_norm warm_start.max_grad_norm algorithm.clip_advantage "
      "algorithm.max_reward optim.lora.alpha algorithm.rollout_correction_cap algorithm.nft_beta algorithm.nft_adv_clip",
      lambda v: v > 0, "must be > 0")


_rule("algorithm.dual_clip", lambda v: v > 1, "must be > 1 (dual-clip bound c, Ye et al. 2020)")


_rule("optim.lora.dropout", lambda v: 0 <= v < 1, "must be in [0, 1)")


_rule("sampling.variance_mix", lambda v: 0 <= v <= 1, "must be in [0, 1]")


_rule("optim.betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "must be two numbers in [0, 1)")


_rule("algorithm.chunks", lambda v: len(v) > 0 and all(c >= 1 for c in v), "must be positive unit counts")


LOCAL_PATH_PREFIXES = ("/", "./", "../", "~")


def _get(cfg: Any, dotted: str) -> tuple[bool, Any]:
    node = cfg
    for part in dotted.split("."):
        if not hasattr(node, part):
            return False, None  # a field another version of the config does not have
        node = getattr(node, part)
    return True, node


def _unknown(kind: str, key: str, value: Any, known: Iterable[str]) -> str:
    known = sorted(known)
    close = difflib.get_close_matches(str(value), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{key}: {value!r} is not a registered {kind}{hint}; registered: {', '.join(known) or 'none'}"


def _check_name(problems: list[str], registry: Registry, key: str, value: Any, extra: Iterable[str] = ()) -> bool:
    if value in registry or value in extra:
        return True
    problems.append(_unknown(registry.kind, key, value, [*registry.names(), *extra]))
    return False


def _check_ranges(cfg: TrainConfig, problems: list[str]) -> None:
    for key, (test, text) in RANGES.items():
        present, value = _get(cfg, key)
        if not present or value is None:
            continue
        numbers = value if isinstance(value, list) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            problems.append(f"{key}={value!r} must be a finite number")
        elif not test(value):
            problems.append(f"{key}={value!r} {text}")


def _check_policy(cfg: TrainConfig, problems: list[str]) -> None:
    if not _check_name(problems, ADAPTERS, "task", cfg.task):
        return
    adapter = ADAPTERS.get(cfg.task)
    try:
        policy_cfg = from_dict(adapter.Config, cfg.policy, "policy")
    except ConfigError as e:
        problems += str(e).splitlines()
        return
    except (TypeError, ValueError) as e:
        problems.append(f"policy: {e}")
        return
    for name, value in vars(policy_cfg).items():
        if isinstance(value, str) and value.startswith(LOCAL_PATH_PREFIXES) and not Path(value).expanduser().exists():
            problems.append(f"policy.{name}: local path {value!r} does not exist")
    check = getattr(adapter, "config_problems", None)  # an adapter's own checks that need no model
    if check is not None:
        problems += check(policy_cfg)
    group_check = getattr(adapter, "group_size_problems", None)
    if group_check is not None:
        problems += group_check(policy_cfg, cfg.algorithm.group_size)
    if cfg.algorithm.objective in OBJECTIVES.names():
        _check_unit_terms(cfg, adapter.unit_terms(policy_cfg), problems)
    if cfg.algorithm.ratio_norm != "none":
        _check_ratio_norm(cfg, adapter.step_scale_problem(policy_cfg), problems)
    if cfg.algorithm.trust_region == "dppo":
        _check_dppo(cfg, adapter.divergence_problem(policy_cfg), problems)


def _check_dppo(cfg: TrainConfig, adapter_problem: str | None, problems: list[str]) -> None:
    """FlowDPPO's mask: in place of the clip objective's per-unit ratio clip, over several update
    passes (with one the policy is the old one and nothing is ever masked), from the adapter's
    exact per-unit divergence."""
    algo = cfg.algorithm
    name = "algorithm.trust_region='dppo'"
    if adapter_problem:
        problems.append(f"{name}: {adapter_problem}")
    if algo.objective != "clip" or algo.ratio_level != "unit" or algo.ratio_norm != "none" or algo.dual_clip:
        problems.append(f"{name} replaces the clip of the clip objective's per-unit ratio (algorithm.objective: clip, "
                        f"ratio_level: unit, ratio_norm: none, dual_clip: null), not objective={algo.objective!r}, "
                        f"ratio_level={algo.ratio_level!r}, ratio_norm={algo.ratio_norm!r}, "
                        f"dual_clip={algo.dual_clip!r}")
    if algo.mu < 2:
        problems.append(f"{name} masks units that moved away from the old policy, which needs algorithm.mu >= 2 "
                        f"update passes (UniRL's FlowDPPO recipe: 2); with mu={algo.mu} nothing is ever masked")
    if not algo.dppo_threshold > 0:
        problems.append(f"algorithm.dppo_threshold={algo.dppo_threshold!r} must be > 0 (UniRL's default 1e-5)")


def _check_ratio_norm(cfg: TrainConfig, adapter_problem: str | None, problems: list[str]) -> None:
    """GRPO-Guard's normalised ratio: the clip objective's unit ratios, one update pass (the old
    step mean is the current one, so its mean-shift term is 0), and the adapter's step scales."""
    algo = cfg.algorithm
    name = f"algorithm.ratio_norm={algo.ratio_norm!r}"
    if adapter_problem:
        problems.append(f"{name}: {adapter_problem}")
    if algo.objective != "clip" or algo.ratio_level != "unit":
        problems.append(f"{name} normalises the clip objective's per-step ratio (algorithm.objective: clip, "
                        f"ratio_level: unit), not objective={algo.objective!r}, ratio_level={algo.ratio_level!r}")
    if algo.mu != 1:
        problems.append(f"{name} needs algorithm.mu: 1 (mmrl keeps no old step means for GRPO-Guard's "
                        f"mean-shift term), not {algo.mu}")


def _check_unit_terms(cfg: TrainConfig, given: str, problems: list[str]) -> None:
    """The objective takes what the adapter's units give (log-probs, or DiffusionNFT's implicit
    velocity losses), and an implicit-velocity objective is run as its authors run it."""
    algo = cfg.algorithm
    wanted = OBJECTIVES.get(algo.objective).unit_terms
    if wanted != given:
        problems.append(f"algorithm.objective={algo.objective!r} takes {wanted} from the policy, and the "
                        f"{cfg.task!r} adapter under this policy section gives {given} "
                        f"(DiffusionNFT: objective nft with task diffusion and policy.units: forward_process)")
    if wanted != "implicit_velocity":
        return
    if algo.mu != 1:
        problems.append(f"algorithm.mu={algo.mu}: objective {algo.objective!r} takes the policy at the step's "
                        "start as its old policy, so it runs one update pass per batch (mu: 1)")
    if algo.beta > 0 and algo.kl_estimator != CLOSED_FORM_KL:
        problems.append(f"algorithm.kl_estimator={algo.kl_estimator!r}: objective {algo.objective!r} has no "
                        "log-probs; its KL is the velocity's to the reference (kl_estimator: closed_form)")
    for name in ("entropy_coef", "llds_coef"):
        if getattr(algo, name):
            problems.append(f"algorithm.{name}={getattr(algo, name)}: objective {algo.objective!r} has no "
                            "log-probs to regularise; set it to 0")


def _check_rewards(cfg: TrainConfig, problems: list[str]) -> None:
    if not cfg.rewards:
        problems.append("rewards: name at least one reward (`mmrl list` shows the registered ones)")
    for name, spec in cfg.rewards.items():
        if not is_plain_reward(name) and not _check_name(problems, REWARDS, f"rewards.{name}", name):
            problems[-1] += f"{_plain_function_hint(cfg, name)}; {HOW_TO_NAME.format(name=name)}"
            continue
        try:
            fn = get_reward(name)
        except ValueError as e:  # a plain function that cannot be loaded
            problems.append(f"rewards.{name}: {e}")
            continue
        if not math.isfinite(spec.weight):
            problems.append(f"rewards.{name}.weight={spec.weight!r} must be a finite number")
        problems += remote_problems(name, spec)
        params = inspect.signature(fn).parameters.values()
        accepted = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                    and p.name not in ("prompts", "completions")]
        for arg, value in spec.args.items():
            if arg not in accepted:
                close = difflib.get_close_matches(arg, accepted, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(f"rewards.{name}.args.{arg}={value!r}: reward {name!r} takes no argument "
                                f"{arg!r}{hint}; its arguments: {', '.join(accepted) or 'none'}")


def _plain_function_hint(cfg: TrainConfig, name: str) -> str:
    """' (did you mean ...)' when a file or module of `reward_modules` has a function `name`."""
    for module in cfg.reward_modules:
        try:
            found = callable(getattr(import_user_module(module), name, None))
        except (ImportError, FileNotFoundError):
            continue
        if found:
            return f" ({module!r} has a plain function {name!r}: did you mean '{module}:{name}'?)"
    return ""


def _check_algorithm(cfg: TrainConfig, problems: list[str]) -> None:
    algo = cfg.algorithm
    _check_name(problems, ADVANTAGE_ESTIMATORS, "algorithm.estimator", algo.estimator)
    _check_name(problems, OBJECTIVES, "algorithm.objective", algo.objective)
    _check_name(problems, AGGREGATIONS, "algorithm.aggregation", algo.aggregation)
    _check_name(problems, KL_ESTIMATORS, "algorithm.kl_estimator", algo.kl_estimator, [CLOSED_FORM_KL])
    if algo.ratio_level == "chunk" and not algo.chunks:
        problems.append("algorithm.chunks: ratio_level='chunk' needs the chunk sizes (a list of unit counts)")
    if algo.estimator == "median" and algo.group_size % 2 == 0:  # mmrl/core/advantages.py's median_advantages
        problems.append(f"algorithm.group_size={algo.group_size}: the median estimator (MC-GRPO) draws G+1 "
                        f"rollouts, an odd number, so that the median is one of them; use {algo.group_size + 1}")
    if 2 * algo.train_extremes > algo.group_size:
        problems.append(f"algorithm.train_extremes={algo.train_extremes}: the k highest and k lowest rows of a "
                        f"group of algorithm.group_size={algo.group_size} overlap; use at most "
                        f"{algo.group_size // 2}")


def _check_optim(cfg: TrainConfig, problems: list[str], num_processes: int) -> None:
    from transformers import SchedulerType
    schedules = [s.value for s in SchedulerType]
    if cfg.optim.schedule not in schedules:
        problems.append(_unknown("LR schedule", "optim.schedule", cfg.optim.schedule, schedules))
    pps = cfg.optim.prompts_per_step
    if pps >= 1 and pps % num_processes:
        problems.append(f"optim.prompts_per_step={pps} must be a multiple of the {num_processes} processes")


def _stage_plan(cfg: TrainConfig, problems: list[str], num_processes: int) -> StagePlan | None:
    """The run's stage plan, each stage's settings checked as the recipe's (ranges, prompts per step
    against the processes); None where the recipe's own problems, already reported, keep it from
    being built."""
    if not cfg.stages and problems:
        return None
    plan = StagePlan(cfg)
    for stage in plan.stages if cfg.stages else ():
        found: list[str] = []
        _check_ranges(stage.config, found)
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
        _check_name(problems, DATASETS, "data.name", data.name)
    for key in ("path", "eval_path"):
        value = getattr(data, key, None)
        if isinstance(value, str) and ":" not in value and not Path(value).expanduser().exists():
            problems.append(f"data.{key}: {value!r} does not exist")
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
    if _check_name(problems, STRATEGIES, "distributed.strategy", dist.strategy):
        problems += STRATEGIES.get(dist.strategy).config_problems(cfg)
    vllm = cfg.policy.get("vllm") or {}
    tensor_parallel = vllm.get("tensor_parallel_size", 1) if isinstance(vllm, dict) else 1
    if (cfg.policy.get("rollout_engine") == "vllm" and num_processes > 1 and isinstance(tensor_parallel, int)
            and tensor_parallel > 1):
        problems.append(f"policy.vllm.tensor_parallel_size={tensor_parallel} with {num_processes} processes: each "
                        "process drives a vLLM engine of its own on its own prompts, so an engine cannot span "
                        "processes; use tensor_parallel_size 1 under a multi-process launch")


def _check_warm_start(cfg: TrainConfig, problems: list[str]) -> None:
    """After a warm start the KL's reference is the warm-started model, a copy of the policy's weights
    (Trainer.reference_from_policy), not an adapter switched off (the strategies say what they keep)."""
    if cfg.warm_start.steps <= 0 or not regulariser_needs(cfg.algorithm, "reference"):
        return
    if cfg.optim.lora.r > 0:
        problems.append(f"warm_start.steps={cfg.warm_start.steps} with optim.lora.r={cfg.optim.lora.r} and a KL "
                        f"(algorithm.beta={cfg.algorithm.beta}): the LoRA reference is the adapter switched off, "
                        "the model before the warm start; train without LoRA, or without the KL")


def validate(cfg: TrainConfig, num_processes: int = 1) -> StagePlan:
    """Raise one `ConfigError` listing every problem of `cfg`, or return the run's plan: its stages,
    each with its ``policy:`` section typed by the adapter (the only place it is typed). Imports the
    plugins and the recipe's `reward_modules` (to know their names), loads no model, data set or
    reward model."""
    load_plugins()
    problems: list[str] = []
    for module in cfg.reward_modules:
        try:
            import_user_module(module)
        except (ImportError, FileNotFoundError) as e:
            problems.append(f"reward_modules: {module!r}: {e}")
    _check_policy(cfg, problems)
    _check_rewards(cfg, problems)
    _check_algorithm(cfg, problems)
    _check_optim(cfg, problems, num_processes)
    _check_data_and_logging(cfg, problems)
    _check_distributed(cfg, problems, num_processes)
    _check_warm_start(cfg, problems)
    _check_ranges(cfg, problems)
    problems += rollout_mode_problems(cfg, num_processes)
    plan = _stage_plan(cfg, problems, num_processes)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems in the recipe:\n  " + "\n  ".join(problems))
    return plan
