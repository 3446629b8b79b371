"""On-policy distillation's teacher in the plan (`algorithm.distill`): its policy section typed by the
student's adapter, and what the chosen divergence needs of that adapter, checked before any model loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmrl.config.parse import ConfigError, from_dict
from mmrl.config.rollouts import adapter_policy
from mmrl.config.sections import TrainConfig
from mmrl.core.objectives import OBJECTIVES
from mmrl.core.policy import Policy
from mmrl.registry import ADAPTERS

TEACHER_FIELD = "algorithm.distill.teacher"


def teacher_policy_config(cfg: TrainConfig) -> Any:
    """The teacher's policy section typed by the student's adapter: the recipe's ``policy:`` with the
    keys of `algorithm.distill.teacher` replacing its own (a `ConfigError` naming the teacher's key)."""
    adapter = ADAPTERS.get(cfg.task)
    merged = {**adapter_policy(cfg.policy), **cfg.algorithm.distill.teacher}
    unknown = sorted(set(cfg.algorithm.distill.teacher) - {f for f in adapter.Config.__dataclass_fields__})
    if unknown:
        raise ConfigError(f"{TEACHER_FIELD}.{unknown[0]}: not a key of the {cfg.task!r} adapter's policy section")
    return from_dict(adapter.Config, merged, TEACHER_FIELD)


def check_distill(cfg: TrainConfig, adapter: type[Policy], policy_cfg: Any, problems: list[str]) -> None:
    """The teacher's section, the objective (one that takes per-unit advantages) and what the divergence
    needs of the adapter: its exact per-unit divergence (closed_form) or its units' logits (jsd)."""
    distill = cfg.algorithm.distill
    try:
        teacher = teacher_policy_config(cfg)
    except ConfigError as e:
        problems += str(e).splitlines()
        return
    for name, value in vars(teacher).items():
        if name in distill.teacher and isinstance(value, str) and value.startswith(("/", "./", "../", "~")) \
                and not Path(value).expanduser().exists():
            problems.append(f"{TEACHER_FIELD}.{name}: local path {value!r} does not exist")
    objective = OBJECTIVES.get(cfg.algorithm.objective) if cfg.algorithm.objective in OBJECTIVES.names() else None
    if objective is not None and (objective.row_coefficients is not None or objective.unit_terms != "logprobs"):
        problems.append(f"algorithm.distill: the signal is a per-unit advantage, and algorithm.objective="
                        f"{cfg.algorithm.objective!r} takes one advantage per row; use objective clip")
    if distill.weight < 0:
        problems.append(f"algorithm.distill.weight={distill.weight} must be >= 0 (it pulls the student to the teacher)")
    if not 0.0 <= distill.beta <= 1.0:
        problems.append(f"algorithm.distill.beta={distill.beta} must lie in [0, 1]")
    if distill.form == "loss" and distill.divergence == "sampled":
        problems.append("algorithm.distill.form='loss' differentiates the divergence through the student, and the "
                        "sampled one-sample estimate has no such gradient; use closed_form or jsd, or form advantage")
    if distill.divergence == "closed_form" and adapter.divergence_problem(policy_cfg):
        problems.append(f"algorithm.distill.divergence='closed_form' needs the adapter's exact per-unit KL: "
                        f"{adapter.divergence_problem(policy_cfg)}")
    if distill.divergence == "jsd" and adapter.unit_logits is Policy.unit_logits:
        problems.append(f"algorithm.distill.divergence='jsd' needs the units' logits over a vocabulary, and the "
                        f"{cfg.task!r} adapter has none; use sampled")
