"""Typed recipes: YAML -> dataclasses, with ``key=value`` overrides (dotted for nested fields).

Unknown keys and values of the wrong type are errors naming the dotted key. The ``policy``
section is typed by the chosen adapter's own ``Config`` dataclass (see `mmrl.policy.Policy`).
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A recipe or override that does not fit the config schema."""


@dataclass
class AlgorithmConfig:
    """Advantage estimation and the clipped surrogate (docs/methods.md, 'Advantage estimators' and
    'Objectives')."""

    group_size: int = 8
    estimator: str = "grpo"
    std: Literal["group", "batch", "none"] = "group"
    eps: float = 1e-4
    clip_advantage: float | None = None
    drop_zero_variance: bool = False
    reward_combine: Literal["sum", "advantage"] = "sum"
    max_reward: float = 1.0
    ratio_level: Literal["unit", "chunk", "sequence"] = "unit"
    chunks: list[int] | None = None
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    beta: float = 0.0
    kl_estimator: str = "k3"
    aggregation: str = "token_mean"
    max_units: int | None = None
    entropy_coef: float = 0.0
    llds_coef: float = 0.0
    prune_threshold: float = 0.0
    mu: int = 1
    objective: str = "clip"


@dataclass
class LoraConfig:
    r: int = 0
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    schedule: str = "constant"
    warmup_steps: int = 0
    max_grad_norm: float | None = 1.0
    prompts_per_step: int = 4
    micro_batch_size: int = 8
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class SamplingConfig:
    """How the prompts of a step are drawn (docs/methods.md, 'Prompt sampling')."""

    strategy: Literal["uniform", "variance"] = "uniform"
    variance_mix: float = 0.5
    variance_window: int = 4
    diversity_weight: float = 0.0
    curriculum_column: str | None = None
    curriculum_descending: bool = False
    dynamic: bool = False
    dynamic_max_tries: int = 4


@dataclass
class DataConfig:
    name: str | None = None
    path: str | None = None
    eval_path: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    prompt_column: str = "prompt"


@dataclass
class RewardSpec:
    weight: float = 1.0
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoggingConfig:
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    plot_every: int = 10
    progress: bool = True


@dataclass
class EvalConfig:
    every: int = 0
    max_prompts: int = 64
    group_size: int = 8


@dataclass
class WarmStartConfig:
    """Supervised warm start before RL (used by the demos): `steps` passes of `batch_size`
    rows on the data set's `target_column`, gradients clipped to `max_grad_norm` if set."""

    steps: int = 0
    lr: float = 1e-3
    batch_size: int = 32
    target_column: str = "target"
    max_grad_norm: float | None = None


@dataclass
class TrainConfig:
    task: str = "causal_lm"
    policy: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    rewards: dict[str, RewardSpec] = field(default_factory=dict)
    reward_modules: list[str] = field(default_factory=list)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    output_dir: str = "outputs/run"
    seed: int = 0
    max_steps: int = 100
    save_every: int = 0
    resume: bool = False


def _check_value(tp: Any, value: Any, key: str) -> Any:
    """Return `value` converted to type `tp`, or raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        # one alternative (an Optional field): its own message says what was expected
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} fits none of {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_check_value(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return {k: _check_value(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-5` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported field type {tp}")


def from_dict(cls: type, data: dict[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'recipe'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            raise ConfigError(f"unknown config key {dotted!r}; valid keys: {', '.join(sorted(names))}")
        kwargs[key] = _check_value(hints[key], value, dotted)
    return cls(**kwargs)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set ``a.b.c=value`` pairs in a nested mapping; values are parsed as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw != "" else ""
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_recipe(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe {str(path)!r} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    return parse_config(data, overrides)


def parse_config(data: dict[str, Any], overrides: list[str] = ()) -> TrainConfig:
    data = apply_overrides(copy.deepcopy(data), list(overrides))
    return from_dict(TrainConfig, data)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
