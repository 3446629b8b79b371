"""Training in stages: a recipe's ``stages:`` list changes settings between optimizer steps
(Vision-R1's progressive thinking suppression: growing completion length and shrinking group
size; SARI's curriculum: easy data, then hard data).

Each stage is ``{steps: N, <overrides>}``; overrides are written nested
(``policy: {max_new_tokens: 512}``) or dotted (``policy.max_new_tokens: 512``). Stage k runs the
steps after the first N_0 + ... + N_{k-1} and its settings are the RECIPE's with stage k's own
overrides (a stage does not inherit another stage's overrides). ``max_steps`` may not exceed
N_0 + ... + N_last; a smaller ``max_steps`` ends the run inside the plan. The stage of a step is a
function of the step count alone, so every process switches at the same step and a resumed run
lands in the stage an uninterrupted one is in. The model and the optimizer state carry over.

What a stage may change is marked ``"stage": True`` in the fields' metadata (mmrl/config/), ``rewards.NAME.weight`` /
``.args`` of the recipe's rewards, and the adapter's own `Policy.stage_fields` under ``policy``;
anything else (task, model, LoRA, schedule, seed, ...) is an error naming the field. A stage
that changes ``data.*`` or ``sampling.*`` starts a fresh prompt sampler over its data (seeded
from the run seed and the stage index); otherwise the data position carries on. Setting
``data.name`` or ``data.path`` replaces the recipe's data source (its other one and its
``args`` are dropped unless the stage gives them).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrl.config.parse import ConfigError, from_dict, to_dict
from mmrl.config.rollouts import adapter_policy
from mmrl.config.sections import TrainConfig
from mmrl.core.advantages import check_reward_combine
from mmrl.core.seeding import derive_seed
from mmrl.registry import ADAPTERS, DATASETS, load_plugins


def _stage_fields() -> dict[str, tuple[str, ...]]:
    """Section -> the engine fields a stage may change (marked ``"stage": True`` in their metadata)."""
    recipe, out = TrainConfig(), {}
    for section in dataclasses.fields(recipe):
        value = getattr(recipe, section.name)
        marked = tuple(f.name for f in dataclasses.fields(value) if f.metadata.get("stage")) \
            if dataclasses.is_dataclass(value) else ()
        if marked:
            out[section.name] = marked
    return out


STAGE_FIELDS = _stage_fields()
REWARD_FIELDS = ("weight", "args")
# mappings merged key by key when a stage overrides part of them (other mappings are replaced)
SECTIONS = ("policy", "data", "algorithm", "optim", "sampling", "eval", "rewards")
SAMPLER_SALT = 0x57A9E


def _expand(stage: dict[str, Any], where: str) -> dict[str, Any]:
    """A stage's overrides with dotted keys (``policy.max_new_tokens``) made nested."""
    out: dict[str, Any] = {}
    for key, value in stage.items():
        node, parts = out, str(key).split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{where}.{key}: {part!r} is given twice, as a value and as a section")
        if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
            node[parts[-1]].update(value)
        else:
            node[parts[-1]] = value
    return out


def _leaves(overrides: dict[str, Any]) -> list[str]:
    """Dotted names of the fields a stage sets (sections and ``rewards.NAME`` are descended)."""
    out = []
    for key, value in overrides.items():
        if key in SECTIONS and isinstance(value, dict):
            for sub, inner in value.items():
                if key == "rewards" and isinstance(inner, dict):
                    out += [f"rewards.{sub}.{field}" for field in inner] or [f"rewards.{sub}"]
                else:
                    out.append(f"{key}.{sub}")
        else:
            out.append(key)
    return out


def _merge(recipe: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(recipe)
    for key, value in overrides.items():
        if key in SECTIONS and isinstance(value, dict) and isinstance(out.get(key), dict):
            section = out[key]
            if key == "data" and ("name" in value or "path" in value):
                for dropped in ("name", "path", "args"):
                    section.pop(dropped, None)
            for sub, inner in value.items():
                if key == "rewards" and isinstance(inner, dict) and isinstance(section.get(sub), dict):
                    section[sub] = {**section[sub], **copy.deepcopy(inner)}
                else:
                    section[sub] = copy.deepcopy(inner)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class Stage:
    index: int
    first_step: int  # 1-based, inclusive
    last_step: int   # inclusive
    config: TrainConfig
    policy: Any      # the ``policy:`` section typed by the adapter's own Config, once for the run


class StagePlan:
    """The run's stages, validated; a recipe without ``stages`` is one stage over every step."""

    def __init__(self, cfg: TrainConfig):
        self.recipe = cfg
        if not cfg.stages:
            self.stages = [Stage(0, 1, max(cfg.max_steps, 1), cfg, from_dict(_adapter_config(cfg.task), adapter_policy(cfg.policy), "policy"))]
            return
        base = to_dict(cfg)
        base.pop("stages")
        stage_fields = _policy_stage_fields(cfg.task)
        self.stages = []
        first = 1
        for k, raw in enumerate(cfg.stages):
            where = f"stages[{k}]"
            if not isinstance(raw, dict):
                raise ConfigError(f"{where}: expected a mapping {{steps: N, <overrides>}}, got {raw!r}")
            overrides = _expand(raw, where)
            steps = overrides.pop("steps", None)
            if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
                raise ConfigError(f"{where}.steps: expected a positive integer, got {steps!r}")
            for name in _leaves(overrides):
                _check_changeable(name, cfg, stage_fields, where)
            try:
                config = from_dict(TrainConfig, _merge(base, overrides))
                policy = from_dict(_adapter_config(cfg.task), adapter_policy(config.policy), "policy")
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from e
            _check_stage(config, cfg, where)
            self.stages.append(Stage(k, first, first + steps - 1, config, policy))
            first += steps
        total = self.stages[-1].last_step
        if cfg.max_steps > total:
            raise ConfigError(f"max_steps={cfg.max_steps} is more than the {total} steps the stages plan "
                              f"({' + '.join(str(s.last_step - s.first_step + 1) for s in self.stages)}); "
                              "lengthen a stage or lower max_steps")

    @property
    def staged(self) -> bool:
        return bool(self.recipe.stages)

    @property
    def planned_steps(self) -> int:
        return self.stages[-1].last_step

    def stage_at(self, step: int) -> Stage:
        """The stage that trains step `step` (1-based); step 0 (nothing trained yet) is stage 0."""
        for stage in self.stages:
            if step <= stage.last_step:
                return stage
        return self.stages[-1]

    def same_data(self, a: Stage, b: Stage) -> bool:
        """Whether the two stages draw prompts alike (same data and sampling settings)."""
        return a.config.data == b.config.data and a.config.sampling == b.config.sampling

    def sampler_seed(self, stage: Stage) -> int:
        """The seed of the prompt sampler in use in `stage`: the run seed while the data is the
        recipe's first stage's, else derived from the stage that started the current data."""
        origin = stage.index
        while origin > 0 and self.same_data(self.stages[origin - 1], stage):
            origin -= 1
        seed = self.recipe.seed
        return seed if origin == 0 else derive_seed(seed, SAMPLER_SALT, origin)


def _adapter(task: str):
    load_plugins()
    return ADAPTERS.get(task)


def _adapter_config(task: str) -> type:
    return _adapter(task).Config


def _policy_stage_fields(task: str) -> frozenset[str]:
    return frozenset(getattr(_adapter(task), "stage_fields", frozenset()))


def _check_changeable(name: str, cfg: TrainConfig, policy_fields: frozenset[str], where: str) -> None:
    section, _, rest = name.partition(".")
    if section == "policy":
        if rest in policy_fields:
            return
        allowed = ", ".join(sorted(policy_fields)) or "none"
        raise ConfigError(f"{where}.{name}: a stage may not change {name} (the model is built once); "
                          f"policy fields the {cfg.task!r} adapter lets a stage change: {allowed}")
    if section == "rewards":
        reward, _, field = rest.partition(".")
        if reward not in cfg.rewards:
            raise ConfigError(f"{where}.{name}: {reward!r} is not one of the recipe's rewards "
                              f"{sorted(cfg.rewards)} (a stage may reweight them, give 0 to switch one off)")
        if field in REWARD_FIELDS:
            return
        raise ConfigError(f"{where}.{name}: a stage may change only rewards.NAME.weight and rewards.NAME.args")
    if rest in STAGE_FIELDS.get(section, ()):
        return
    allowed = "; ".join(f"{s}.{{{', '.join(f)}}}" for s, f in STAGE_FIELDS.items())
    raise ConfigError(f"{where}.{name}: a stage may not change {name} (it is fixed for the run); a stage may "
                      f"change {allowed}; rewards.NAME.weight / .args; and the adapter's policy fields")


def _check_stage(config: TrainConfig, recipe: TrainConfig, where: str) -> None:
    algo = config.algorithm
    try:
        check_reward_combine(algo.reward_combine, algo.gates, {k: s.weight for k, s in config.rewards.items()})
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from e
    if algo.beta != 0 and recipe.algorithm.beta == 0 and recipe.optim.lora.r == 0:
        raise ConfigError(f"{where}.algorithm.beta={algo.beta}: the recipe's algorithm.beta is 0, so no "
                          "reference model is kept; give the recipe a non-zero beta (or LoRA) to switch the KL on")
    for key in ("group_size", "mu"):
        if getattr(algo, key) < 1:
            raise ConfigError(f"{where}.algorithm.{key}={getattr(algo, key)} must be >= 1")
    if algo.trust_region == "dppo" and algo.mu < 2:
        raise ConfigError(f"{where}.algorithm.mu={algo.mu}: the run's algorithm.trust_region='dppo' masks units "
                          "that moved away from the old policy, which needs mu >= 2 update passes in every stage")
    if algo.ratio_norm != "none" and algo.mu != 1:
        raise ConfigError(f"{where}.algorithm.mu={algo.mu}: the run's algorithm.ratio_norm={algo.ratio_norm!r} "
                          "needs mu: 1 in every stage (no old step means are kept for its mean-shift term)")
    if config.optim.prompts_per_step < 1:
        raise ConfigError(f"{where}.optim.prompts_per_step={config.optim.prompts_per_step} must be >= 1")
    data = config.data
    if data == recipe.data:
        return
    if (data.name is None) == (data.path is None):
        raise ConfigError(f"{where}.data: give exactly one of data.name or data.path")
    if data.path is not None and not Path(data.path).is_file():
        raise ConfigError(f"{where}.data.path: {data.path!r} does not exist")
    if data.name is not None:
        if data.name not in DATASETS:
            raise ConfigError(f"{where}.data.name: {data.name!r} is not a registered data set "
                              f"({', '.join(DATASETS.names())})")
