"""Plain reward functions named by where they live, called with TRL's convention.

A recipe names one as ``rewards: {"my_rewards.py:reward_len": {weight: 1.0}}`` (a file, relative
to the working directory) or ``"my_pkg.rewards:reward_len"`` (an importable module): no decorator
and no ``reward_modules`` entry are needed. The function is called as TRL's GRPOTrainer calls its
reward functions (trl 1.x, ``GRPOTrainer._calculate_rewards``):

- ``prompts``: the rows' prompts; a conversational prompt is its list of ``{"role", "content"}``
  messages, a standard one its string;
- ``completions``: for a conversational prompt, ``[{"role": "assistant", "content": text}]``,
  else the text;
- keyword arguments: every data column (one value per completion, the prompt column included),
  ``completion_ids`` (each completion's token ids; the language-model adapters give them), the
  engine's ``group_id`` and ``auxiliary``, and ``log_metric(name, value)`` when the function
  takes it or ``**kwargs`` (mmrl adds the values of a step: ``reward/<name>/<key>``).

It returns one float per completion, or None where it does not apply. TRL's ``trainer_state``,
``log_extra`` and ``environments`` are not passed: a function that requires one is refused when
the recipe is checked.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable, Sequence

from mmrl.registry import import_user_module

SEPARATOR = ":"
ENGINE_ARGUMENTS = ("completion_ids", "log_metric")  # given by the engine, never read from the data
NOT_PASSED = ("trainer_state", "log_extra", "environments")  # TRL passes these; mmrl does not


def is_plain_reward(name: str) -> bool:
    """Whether a reward name is ``module:function`` rather than a registered name."""
    return SEPARATOR in name


class PlainReward:
    """A plain function called with TRL's convention (the module docstring); its signature, as
    `inspect.signature` reports it, is the function's without the engine's arguments, plus
    ``log_metric`` when the function accepts it."""

    def __init__(self, name: str, function: Callable[..., Sequence[float | None]]):
        self.name, self.function = name, function
        params = inspect.signature(function).parameters.values()
        self.takes_log_metric = any(p.name == "log_metric" or p.kind == p.VAR_KEYWORD for p in params)
        kept = [p for p in params if p.name not in ENGINE_ARGUMENTS]
        if self.takes_log_metric:
            at = next((k for k, p in enumerate(kept) if p.kind == p.VAR_KEYWORD), len(kept))
            kept.insert(at, inspect.Parameter("log_metric", inspect.Parameter.KEYWORD_ONLY, default=None))
        self.__signature__ = inspect.Signature(kept)
        self.__name__ = getattr(function, "__name__", name)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], log_metric=None, **columns):
        messages = [[{"role": "assistant", "content": c}] if isinstance(p, list) else c
                    for p, c in zip(prompts, completions)]
        if self.takes_log_metric and log_metric is not None:
            columns["log_metric"] = log_metric
        return self.function(prompts=list(prompts), completions=messages, **columns)


def load_plain_reward(name: str) -> PlainReward:
    """The function `name` (``file.py:function`` or ``module:function``) names; ValueError saying
    what is wrong (no such file, module or function; an argument mmrl does not pass)."""
    where, _, attribute = name.rpartition(SEPARATOR)
    if not where or not attribute:
        raise ValueError(f"reward {name!r}: name a plain function as FILE.py:FUNCTION or MODULE:FUNCTION")
    if where.endswith(".py") and not Path(where).is_file():
        raise ValueError(f"reward {name!r}: file {where!r} does not exist (relative to {Path.cwd()})")
    try:
        module = import_user_module(where, f"rewards.{name}")
    except ImportError as e:
        raise ValueError(f"reward {name!r}: cannot import {where!r} ({e})") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ValueError(f"reward {name!r}: {where!r} has no function {attribute!r}; its functions: "
                         f"{', '.join(found) or 'none'}")
    required = [p.name for p in inspect.signature(function).parameters.values()
                if p.name in NOT_PASSED and p.default is p.empty]
    if required:
        raise ValueError(f"reward {name!r} requires {required[0]!r}, which mmrl does not pass (TRL's "
                         f"{', '.join(NOT_PASSED)}); give it a default or take it from **kwargs")
    return PlainReward(name, function)
