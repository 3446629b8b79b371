"""Typed recipes: YAML -> dataclasses, with ``key=value`` overrides (dotted for nested fields).

Unknown keys and values of the wrong type are errors naming the dotted key. The ``policy``
section is typed by the chosen adapter's own ``Config`` dataclass (see `mmrl.policy.Policy`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .errors import MissingFileError, UserError


class ConfigError(UserError, ValueError):
    """A recipe or override that does not fit the config schema."""


@dataclass
class AlgorithmConfig:
    """Advantage estimation and the clipped surrogate (REFERENCES.md, 'Advantage estimators' and
    'Policy loss')."""

    group_size: int = 8
    estimator: str = "grpo"
    std: Literal["group", "batch", "none"] = "group"
    eps: float = 1e-4
    clip_advantage: float | None = None
    drop_zero_variance: bool = False
    reward_combine: Literal["sum", "advantage", "gate", "product"] = field(default="sum", metadata={
        "help": "how the recipe's rewards make one: sum (weighted sum, then the estimator), advantage (the "
                "estimator on each reward, then the weighted sum of advantages: DanceGRPO, MixGRPO), gate "
                "(the non-gate rewards' weighted sum counts only where every reward in `gates` reaches its "
                "threshold, plus the gates' own weighted values: Vision-R1's hard formatting result reward) "
                "or product (prod_k w_k r_k); None rewards are left out of each"})
    gates: dict[str, float] = field(default_factory=dict, metadata={
        "help": "with reward_combine: gate, reward name -> threshold; e.g. {format: 1.0} pays the other "
                "rewards only where format >= 1 (Vision-R1). Give a gate weight 0 for a pure gate"})
    max_reward: float = 1.0
    median_scale: Literal["mad", "std"] = field(default="mad", metadata={"help": (
        "normaliser of the median (MC-GRPO) estimator: mad = median absolute deviation of the group + 1e-3 "
        "(MC-GRPO's paper and code, lotusroot-kim/MC-GRPO); std = algorithm.std + algorithm.eps as the "
        "other estimators (mmrl's earlier rule)")})
    median_rescale: bool = field(default=False, metadata={"help": (
        "median (MC-GRPO) estimator: multiply a group's non-zero advantages by (G + 1) / (their number), "
        "as the authors' GSM8K trainer does (their MATH trainer and the paper do not)")})
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
    llds_rows: Literal["non_negative", "all"] = field(default="non_negative", metadata={"help": (
        "which rows LLDS preserves (algorithm.llds_coef > 0): non_negative = only rows (units) with "
        "advantage >= 0, as the LLDS authors' code and model card (Deng et al. 2025); all = every row "
        "whose likelihood fell, so a negative-advantage row is pushed back up (mmrl's earlier rule)")})
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
    """How the prompts of a step are drawn (REFERENCES.md, 'Prompt sampling', DAPO)."""

    strategy: Literal["uniform", "variance"] = "uniform"
    variance_mix: float = 0.5
    variance_window: int = 4
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
    split: str | None = field(default=None, metadata={
        "help": "split of data.path (a hub data set or a save_to_disk directory with splits); default: its "
                "only split, else 'train'"})
    eval_split: str | None = field(default=None, metadata={
        "help": "split of data.eval_path (default: as data.split); data.eval_path may name the same data set "
                "as data.path"})
    subset: str | None = field(default=None, metadata={
        "help": "configuration (subset) of a hub data set, the `name` of datasets.load_dataset"})
    media_root: str | None = field(default=None, metadata={
        "help": "directory that relative media paths resolve against (default: the data file's directory)"})
    columns: dict[str, str] = field(default_factory=dict, metadata={
        "help": "renames {source: target} applied to every row before anything reads it, e.g. "
                "{problem: prompt, solution: answer}"})
    extract: dict[str, str] = field(default_factory=dict, metadata={
        "help": "{column: regex}: the column becomes the first group of the regex's last match, e.g. "
                "{answer: '#### (.*)'} for GSM8K or {answer: '<answer>(.*?)</answer>'}; a row without a match "
                "is invalid"})
    pick: dict[str, str] = field(default_factory=dict, metadata={
        "help": "{column: list_column}: an index in the column becomes that item of the list column, e.g. "
                "{answer: multi_choice} for R1-AQA (after data.columns and data.extract)"})
    prompt_template: str | None = field(default=None, metadata={
        "help": "builds the prompt column from {column} fields of the row (str.format; a list is its items "
                "joined by newlines, {col!r} the Python list, {col[0]} an item), e.g. '{problem}Options:\\n{options}'; "
                "a template without fields is a fixed prompt"})
    answer_from_conversation: bool = field(default=False, metadata={
        "help": "a conversation prompt (messages or LLaVA conversations) that ends with an assistant turn: "
                "true makes that turn the reference answer (in data.answer_column); false refuses the row"})
    answer_column: str = field(default="answer", metadata={
        "help": "column that data.answer_from_conversation writes the final assistant turn to"})
    validate: Literal["all", "sample", "off"] = field(default="all", metadata={
        "help": "rows checked before the model loads (prompt and reward columns present, media readable): "
                "all, an even sample of data.validate_rows per set, or off"})
    validate_rows: int = field(default=1000, metadata={"help": "rows per set checked by data.validate=sample"})
    skip_invalid: bool = field(default=False, metadata={
        "help": "drop rows that fail validation (their count is logged) instead of stopping with the list"})


@dataclass
class RewardSpec:
    weight: float = 1.0
    args: dict[str, Any] = field(default_factory=dict)
    columns: dict[str, str] = field(default_factory=dict, metadata={
        "help": "{argument: column}: the reward reads its argument from that data column, e.g. "
                "{boxes: solution}; an argument that is also a data column is an error naming both"})


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
    keep_best: bool = field(default=False, metadata={
        "help": "with save_total_limit: also keep the checkpoint with the highest eval reward_mean "
                "(scored when an eval falls on a save step)"})


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
    resume: bool | Literal["auto"] = field(default=False, metadata={
        "help": "true: continue the run in output_dir from its newest good checkpoint (an error if there is "
                "none); auto: continue if there is one, else start a new run; false: a new run (refuses a "
                "directory that holds another run's files unless overwrite=true)"})
    overwrite: bool = field(default=False, metadata={
        "help": "clear another run's files (metrics, config, checkpoints, plots) from output_dir before starting"})
    save_total_limit: int | None = field(default=None, metadata={
        "help": "keep only the newest N checkpoints (and the best one with eval.keep_best); null keeps all"})
    max_bad_steps: int = field(default=3, metadata={
        "help": "a step whose loss or gradient norm is NaN/inf is skipped (counted as nonfinite_skipped); "
                "after this many in a row the run saves a checkpoint and stops"})
    stages: list[dict[str, Any]] = field(default_factory=list, metadata={
        "help": "training in stages (Vision-R1 PTST, SARI curriculum): an ordered list of {steps: N, "
                "<overrides>}; stage k takes the recipe's settings with its own overrides of the fields a "
                "stage may change (mmrl/stages.py: e.g. policy.max_new_tokens, algorithm.group_size, "
                "optim.lr, data.path, sampling.*, rewards.NAME.weight); max_steps <= the sum of steps"})


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
    kwargs, problems = {}, []  # every key is checked; the problems are reported together
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"unknown config key {dotted!r}{hint}; valid keys: {', '.join(sorted(names))}")
            continue
        try:
            kwargs[key] = _check_value(hints[key], value, dotted)
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(problems))
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
            if isinstance(node, list):  # a list entry by index, e.g. stages.1.steps=50
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"override {key!r}: {part!r} is not an index of a list of {len(node)}")
                child = node[int(part)]
            else:
                child = node.setdefault(part, {})
            if not isinstance(child, (dict, list)):
                raise ConfigError(f"override {key!r}: {part!r} is not a section")
            node = child
        if isinstance(node, list):
            raise ConfigError(f"override {key!r}: name a field of a list entry (e.g. stages.0.steps=10)")
        node[parts[-1]] = value
    return data


def load_recipe(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"recipe {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: YAML syntax error: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe is a mapping of keys to values, got {type(data).__name__}")
    return parse_config(data, overrides)


def parse_config(data: dict[str, Any], overrides: list[str] = ()) -> TrainConfig:
    data = apply_overrides(copy.deepcopy(data), list(overrides))
    cfg = from_dict(TrainConfig, data)
    if cfg.stages:  # each stage's overrides are checked now, before any model loads
        from .stages import StagePlan
        StagePlan(cfg)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
