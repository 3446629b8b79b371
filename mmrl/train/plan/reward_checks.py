"""The recipe's rewards checked before anything loads: each name registered (or a plain function
`FILE.py:FUNCTION`), its weight finite, its `args` against the function's signature (an argument it
does not name is an error even when it takes ``**kwargs``, with the closest name as a suggestion),
and a served reward's settings."""

from __future__ import annotations

import difflib
import inspect
import math

from mmrl.config.sections import TrainConfig
from mmrl.core.plain_rewards import is_plain_reward
from mmrl.core.scoring import HOW_TO_NAME, REWARDS, get_reward
from mmrl.registry import import_user_module
from mmrl.serving.remote_reward import remote_problems
from mmrl.train.plan.registry_names import check_name


def check_rewards(cfg: TrainConfig, problems: list[str]) -> None:
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
            found = callable(getattr(import_user_module(module, "reward_modules"), name, None))
        except (ImportError, FileNotFoundError):
            continue
        if found:
            return f" ({module!r} has a plain function {name!r}: did you mean '{module}:{name}'?)"
    return ""
