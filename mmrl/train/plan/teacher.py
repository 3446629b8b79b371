"""On-policy distillation's teacher in the plan (`algorithm.distill`): its policy section typed by the
student's adapter, and what the chosen divergence needs of that adapter, checked before any model loads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmrl.config.distill import DistillConfig
from mmrl.config.parse import ConfigError, from_dict
from mmrl.config.rollouts import adapter_policy
from mmrl.config.sections import TrainConfig
from mmrl.core.objectives import OBJECTIVES
from mmrl.core.policy import Policy
from mmrl.registry import ADAPTERS

TEACHER_FIELD = "algorithm.distill.teacher"
SERVED_KEY = "url"  # a teacher {url: ...} is served by `mmrl serve-teacher` (serving/teacher_server.py)


def teacher_policy_config(cfg: TrainConfig, name: str = "teacher") -> Any:
    """The policy section of teacher `name` typed by the student's adapter (`policy_with_keys`)."""
    return policy_with_keys(cfg, cfg.algorithm.distill.named_teachers[name], teacher_field(cfg.algorithm.distill, name))


def policy_with_keys(cfg: TrainConfig, keys: dict[str, Any], where: str) -> Any:
    """The recipe's ``policy:`` with `keys` replacing its own, typed by the student's adapter: a frozen
    model of the student's family (a teacher, a real score); a `ConfigError` names `where`'s unknown key."""
    adapter = ADAPTERS.get(cfg.task)
    unknown = sorted(set(keys) - {f for f in adapter.Config.__dataclass_fields__})
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: not a key of the {cfg.task!r} adapter's policy section")
    return from_dict(adapter.Config, {**adapter_policy(cfg.policy), **keys}, where)


def teacher_field(distill: DistillConfig, name: str) -> str:
    """The recipe key of teacher `name`, as errors name it."""
    return f"algorithm.distill.teachers.{name}" if distill.teachers else TEACHER_FIELD


def teacher_column_check(distill: DistillConfig) -> Callable[[Any], str | None]:
    """A check of a row's `algorithm.distill.teacher_column` value: one of the teachers' names."""
    names = sorted(distill.named_teachers)
    return lambda value: None if value in names else f"names no teacher of algorithm.distill.teachers ({names})"


def teachers_problems(distill: DistillConfig) -> list[str]:
    """How the teachers are named: `teacher` or `teachers`, and a data column to route several."""
    if distill.teacher and distill.teachers:
        return ["algorithm.distill: give teacher (one) or teachers (several, by name), not both"]
    if len(distill.teachers) > 1 and distill.teacher_column is None:
        return [f"algorithm.distill.teachers names {len(distill.teachers)} teachers ({sorted(distill.teachers)}): "
                f"set algorithm.distill.teacher_column, the data column naming each row's teacher"]
    if distill.teacher_column is not None and not distill.teachers:
        return [f"algorithm.distill.teacher_column={distill.teacher_column!r} routes rows among "
                f"algorithm.distill.teachers, and none are named"]
    bad = [name for name, keys in distill.teachers.items() if not isinstance(keys, dict) or not keys]
    found = [f"algorithm.distill.teachers.{name}: a teacher is a mapping of policy keys (e.g. {{model: ...}}), "
             f"not {distill.teachers[name]!r}" for name in bad]
    for name, keys in distill.named_teachers.items():
        if name not in bad and SERVED_KEY in keys:
            found += served_teacher_problems(distill, name, keys)
    return found


def served_teacher_problems(distill: DistillConfig, name: str, keys: dict[str, Any]) -> list[str]:
    """A teacher behind `mmrl serve-teacher` ({url: ...}): the url alone, and the divergence it can give
    (its log-probs of the student's units: sampled)."""
    where = teacher_field(distill, name)
    url = keys[SERVED_KEY]
    found = [] if isinstance(url, str) and url.startswith(("http://", "https://")) else \
        [f"{where}.url={url!r}: a teacher server's address, http://HOST:PORT"]
    if set(keys) != {SERVED_KEY}:
        found.append(f"{where}: a served teacher is its url alone (its policy keys are the server's recipe); "
                     f"drop {sorted(set(keys) - {SERVED_KEY})}")
    if distill.divergence != "sampled":
        found.append(f"algorithm.distill.divergence={distill.divergence!r} needs the teacher's model in this process; "
                     f"a served teacher ({where}.url) gives its log-probs of the student's units: use sampled")
    return found


def is_served(keys: dict[str, Any]) -> bool:
    """Whether a teacher's keys name a teacher server rather than a policy built here."""
    return SERVED_KEY in keys


def check_distill(cfg: TrainConfig, adapter: type[Policy], policy_cfg: Any, problems: list[str]) -> None:
    """The teacher's section, the objective (one that takes per-unit advantages) and what the divergence
    needs of the adapter: its exact per-unit divergence (closed_form) or its units' logits (jsd)."""
    distill = cfg.algorithm.distill
    found = teachers_problems(distill)
    if found:
        problems += found
        return
    for teacher_name, keys in distill.named_teachers.items():
        if is_served(keys):
            continue
        try:
            teacher = teacher_policy_config(cfg, teacher_name)
        except ConfigError as e:
            problems += str(e).splitlines()
            continue
        for name, value in vars(teacher).items():
            if name in keys and isinstance(value, str) and value.startswith(("/", "./", "../", "~")) \
                    and not Path(value).expanduser().exists():
                problems.append(f"{teacher_field(distill, teacher_name)}.{name}: local path {value!r} does not exist")
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
