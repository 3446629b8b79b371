"""The recipe's rewards checked before anything loads: each name registered (or a plain function
`FILE.py:FUNCTION`), its weight finite, its `args` against the function's signature and the values
its annotations allow (`reward_args`), the kinds of completion it declares it scores against what
the adapter draws (`register_reward(..., outputs=...)`, `Policy.output_kind`), and a served
reward's settings and urls (`reward_urls`)."""

from __future__ import annotations

import math

from mmrl.config.sections import TrainConfig
from mmrl.core.plain_rewards import is_plain_reward
from mmrl.core.scoring import HOW_TO_NAME, REWARD_OUTPUTS, REWARDS, get_reward
from mmrl.registry import import_user_module
from mmrl.serving.remote_reward import remote_problems
from mmrl.train.plan.registry_names import check_name
from mmrl.train.plan.reward_args import argument_problems
from mmrl.train.plan.reward_urls import url_problems


def check_rewards(cfg: TrainConfig, problems: list[str], output_kind: str | None = None) -> None:
    """Each reward of `cfg` as the module docstring says; `output_kind`: what the adapter's
    completions are (None: not known, not checked)."""
    if not cfg.rewards:
        problems.append("rewards: name at least one reward (`mmrl list` shows the registered ones)")
    for name, spec in cfg.rewards.items():
        if not is_plain_reward(name) and not check_name(problems, REWARDS, f"rewards.{name}", name):
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
        problems += url_problems(name, spec)
        problems += argument_problems(name, fn, spec.args)
        if output_kind is not None and output_kind not in REWARD_OUTPUTS.get(name, (output_kind,)):
            problems.append(output_problem(name, cfg.task, output_kind))


def output_problem(name: str, task: str, kind: str) -> str:
    """A reward of other completions than the adapter's, with the rewards that score the adapter's."""
    suited = sorted(n for n, kinds in REWARD_OUTPUTS.items() if kind in kinds)
    return (f"rewards.{name}: reward {name!r} scores {' or '.join(REWARD_OUTPUTS[name])} completions, and "
            f"task={task} makes {kind} ones with this policy section; rewards that score {kind}: "
            f"{', '.join(suited) or 'none registered'} (and any that declares no outputs)")


def _plain_function_hint(cfg: TrainConfig, name: str) -> str:
    """' (did you mean ...)' when a file or module of `reward_modules` has a function `name`."""
    for module in cfg.reward_modules:
        try:
            found = callable(getattr(import_user_module(module, "reward_modules"), name, None))
        except (ImportError, FileNotFoundError):
            continue
        if found:
            return f" ({module!r} has a plain function {name!r}: did you mean '{module}:{name}'?)"
    return ""
