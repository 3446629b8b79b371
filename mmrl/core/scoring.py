"""The rewards registry base: ``@register_reward(name)`` on ``fn(prompts, completions, **columns)``.

A reward returns one ``float | None`` per completion (None: not applicable to that sample), the
call shape of TRL's reward functions. Data-set columns arrive by name (``answer``,
``reference``, ``boxes``, ...); a reward takes the ones it needs and ignores the rest via
``**kwargs``. Two more columns come from the engine (`score_rollout`): ``group_id`` (each row's
prompt group) and ``auxiliary`` (whether the row is an auxiliary rollout, see `Rollout`), so a
reward may compare the rows of a group (T-GRPO); one registered with ``per_group=True`` is called
once per group with its rows (`group_rewards`). A reward name ``FILE.py:FUNCTION`` or
``module:FUNCTION`` names a plain function instead, called with TRL's convention (`plain_rewards`).

A reward that declares a ``log_metric`` parameter gets a per-call logger, ``log_metric(key,
value=1.0)``, that adds to a count the caller logs as ``reward/<name>/<key>`` (e.g. failed parses
by reason); the counts belong to the call, never to the module.

A reward may declare checks of its columns' values, ``@register_reward(name, check_columns=
{argument: check})``: data validation calls ``check(value, **recipe_args)`` on each row's value
of the column that feeds `argument` (through ``rewards.NAME.columns``) before any model loads;
the check returns None for a value the reward can read, else what is wrong and how to fix it,
reported with the file, row, column and value (`column_checks`).

Two more declarations are checked before any model loads: ``outputs=(KIND, ...)``, the kinds of
completion the reward scores, against the ``Policy.output_kind`` of the recipe's adapter (a reward
that declares none is not checked); ``check_column_names=check``, ``check(columns, **recipe_args)``
called with the names of every column the reward will see (the data's, the engine's and the
adapter's), returning a problem per argument that names what the rows lack (a judge's template
fields). A parameter without a default is a column every row must have (`data.validate`).
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from mmrl.core.group_rewards import GROUP_FLAG, call_per_group, scores_groups
from mmrl.core.plain_rewards import is_plain_reward, load_plain_reward
from mmrl.core.rollout import Rollout
from mmrl.errors import UserError
from mmrl.registry import Registry

RewardFn = Callable[..., Sequence[float | None]]

REWARDS: Registry[RewardFn] = Registry("reward")
ColumnCheck = Callable[..., str | None]  # check(value, **recipe_args) -> None, or what is wrong and the fix
COLUMN_CHECKS: dict[str, dict[str, ColumnCheck]] = {}  # reward name -> argument -> check of its column's values
ColumnNamesCheck = Callable[..., list[str]]  # check(columns, **recipe_args) -> the problems, each naming its argument
COLUMN_NAME_CHECKS: dict[str, ColumnNamesCheck] = {}  # reward name -> check of the names of the columns it sees
REWARD_OUTPUTS: dict[str, tuple[str, ...]] = {}  # reward name -> the kinds of completion it scores


class RewardError(RuntimeError):
    """A reward that raised, returned the wrong number of values, or returned NaN/inf."""


def register_reward(name: str, check_columns: Mapping[str, ColumnCheck] | None = None,
                    per_group: bool = False, outputs: Sequence[str] | None = None,
                    check_column_names: ColumnNamesCheck | None = None) -> Callable[[RewardFn], RewardFn]:
    """Register `fn(prompts, completions, **columns) -> list[float | None]` under `name`;
    `check_columns` (argument -> check), `outputs` (the kinds of completion it scores) and
    `check_column_names` as the module docstring describes; `per_group`: called once per prompt
    group with the group's rows (`group_rewards`)."""
    def decorator(fn: RewardFn) -> RewardFn:
        REWARDS.register(name)(fn)
        if per_group:
            setattr(fn, GROUP_FLAG, True)
        if check_columns:
            COLUMN_CHECKS[name] = dict(check_columns)
        if outputs is not None:
            REWARD_OUTPUTS[name] = tuple(outputs)
        if check_column_names is not None:
            COLUMN_NAME_CHECKS[name] = check_column_names
        return fn

    return decorator


def column_checks(rewards: Mapping[str, tuple[Mapping[str, Any], Mapping[str, str]]]
                  ) -> list[tuple[str, Callable[[Any], str | None]]]:
    """(data column, check of one value) for each column check of the rewards in `rewards`
    (name -> (recipe args, column bindings)); a check returns None, or the problem naming the
    reward and its argument."""
    out = []
    for name, (args, columns) in rewards.items():
        for argument, check in COLUMN_CHECKS.get(name, {}).items():
            column = (columns or {}).get(argument, argument)
            who = f"reward {name!r}" + (f" as {argument!r}" if column != argument else "")
            out.append((column, functools.partial(_column_problem, who, check, dict(args or {}))))
    return out


def column_name_problems(rewards: Mapping[str, Mapping[str, Any]], columns: Sequence[str]) -> list[str]:
    """The problems the rewards' `check_column_names` find (name -> recipe args) with `columns`, the
    names of every column the rewards will see."""
    return [problem for name, args in rewards.items() if name in COLUMN_NAME_CHECKS
            for problem in COLUMN_NAME_CHECKS[name](list(columns), **dict(args or {}))]


def _column_problem(who: str, check: ColumnCheck, args: dict[str, Any], value: Any) -> str | None:
    problem = check(value, **args)
    return None if problem is None else f"{problem} (needed by {who})"


HOW_TO_NAME = ("register a function with @register_reward({name!r}) (from mmrl import register_reward) in a file "
               "listed in reward_modules, or name a plain function with TRL's calling convention as "
               "'FILE.py:{name}' or 'package.module:{name}' (docs/howto-reward.md)")


def get_reward(name: str) -> RewardFn:
    """The reward registered as `name`, or the plain function a ``module:function`` name names
    (`plain_rewards`). An unknown name is a KeyError saying how to register or name one."""
    if is_plain_reward(name):
        return load_plain_reward(name)
    try:
        return REWARDS.get(name)
    except KeyError as e:
        raise KeyError(f"{e.args[0]}; {HOW_TO_NAME.format(name=name)}") from None


def bind_reward(name: str, args: Mapping[str, Any] | None = None,
                columns: Mapping[str, str] | None = None) -> RewardFn:
    """The registered reward with recipe arguments (``rewards.NAME.args``) bound, and its column
    bindings (``rewards.NAME.columns``, argument -> data column) applied: the argument is fed
    from that column at each call."""
    fn = get_reward(name)
    if columns:
        clash = sorted(set(columns) & set(args or {}))
        if clash:
            raise ValueError(f"rewards.{name}: {clash[0]!r} is bound both to a column (rewards.{name}.columns) "
                             f"and to a value (rewards.{name}.args)")
        fn = ColumnBoundReward(name, fn, dict(columns))
    return functools.partial(fn, **args) if args else fn


class ColumnBoundReward:
    """A reward whose arguments are read from other data columns (`columns`: argument -> column).
    A data column that has the argument's own name would be hidden by the binding: that clash is
    an error naming both."""

    def __init__(self, name: str, func: RewardFn, columns: dict[str, str]):
        self.name, self.func, self.columns = name, func, columns
        functools.update_wrapper(self, func)

    def check(self, data_columns: Sequence[str]) -> None:
        """Raise ValueError when a bound argument is also a data column, or a bound column is absent."""
        for arg, column in self.columns.items():
            if arg in data_columns and arg != column:
                raise ValueError(f"rewards.{self.name}.columns binds argument {arg!r} to column {column!r}, "
                                 f"but the data also has a column {arg!r}; rename one (data.columns) or drop "
                                 f"the binding")

    def __call__(self, prompts, completions, **data):
        self.check(list(data))
        for arg, column in self.columns.items():
            if column not in data:
                raise KeyError(f"rewards.{self.name}.columns: argument {arg!r} is bound to column {column!r}, "
                               f"which the rows do not have (columns: {', '.join(sorted(data))})")
            data[arg] = data[column]
        return self.func(prompts=prompts, completions=completions, **data)


MetricLogger = Callable[..., None]


def metric_logger(into: dict[str, float], prefix: str = "") -> MetricLogger:
    """``log_metric(key, value=1.0)`` adding `value` to ``into[prefix + key]``."""
    def log_metric(key: str, value: float = 1.0) -> None:
        into[prefix + key] = into.get(prefix + key, 0.0) + float(value)
    return log_metric


def takes_logger(fn: RewardFn) -> bool:
    """Whether the reward declares a ``log_metric`` parameter."""
    try:
        return "log_metric" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def compute_rewards(fns: Mapping[str, RewardFn], prompts: Sequence[Any], completions: Sequence[Any],
                    columns: Mapping[str, Sequence[Any]], metrics: dict[str, float] | None = None
                    ) -> dict[str, Tensor]:
    """Call each reward; return name -> float tensor [N] with NaN where it gave None. The counts
    rewards log about this call (`log_metric`) are added to `metrics` as ``reward/<name>/<key>``.

    Fails loudly, naming the reward (and the sample where one can be named), when a reward
    raises, returns a wrong-length result, or returns NaN or an infinity.
    """
    n = len(completions)
    out = {}
    for name, fn in fns.items():
        try:
            logger = ({"log_metric": metric_logger(metrics, f"reward/{name}/")}
                      if metrics is not None and takes_logger(fn) else {})
            values = (call_per_group(fn, prompts, completions, columns, logger) if scores_groups(fn) else
                      list(fn(prompts=list(prompts), completions=list(completions), **columns, **logger)))
        except UserError:  # the reward names what to fix (a served reward's server that failed)
            raise
        except Exception as e:  # report which reward broke, keep the original traceback
            raise RewardError(f"reward {name!r} raised {type(e).__name__}: {e}") from e
        if len(values) != n:
            raise RewardError(f"reward {name!r} returned {len(values)} values for {n} completions")
        row = []
        for i, v in enumerate(values):
            if v is None:
                row.append(math.nan)
                continue
            try:
                f = float(v)
            except (TypeError, ValueError):
                raise RewardError(f"reward {name!r} returned {v!r} for sample {i} "
                                  f"(completion {str(completions[i])[:80]!r}); expected a number or None") from None
            if not math.isfinite(f):
                raise RewardError(f"reward {name!r} returned {f} for sample {i} "
                                  f"(completion {str(completions[i])[:80]!r})")
            row.append(f)
        out[name] = torch.tensor(row, dtype=torch.float32)
    return out


ENGINE_COLUMNS = ("group_id", "auxiliary")
RESERVED_COLUMNS = (*ENGINE_COLUMNS, "log_metric")


def _auxiliary(rollout: Rollout) -> Tensor:
    n = len(rollout)
    return rollout.auxiliary if rollout.auxiliary is not None else torch.zeros(n, dtype=torch.bool)


def reward_columns(rollout: Rollout, rows: Sequence[int] | None = None) -> dict[str, list[Any]]:
    """The columns rewards see for the given rows (all by default): the rollout's data-set
    columns plus the engine's ``group_id`` and ``auxiliary`` (a data-set column of either name is
    an error)."""
    for name in RESERVED_COLUMNS:
        if name in rollout.columns:
            raise ValueError(f"column {name!r} is reserved for the engine (rewards receive it); rename it in "
                             "the data set")
    columns = {**rollout.columns, "group_id": rollout.group_id.tolist(), "auxiliary": _auxiliary(rollout).tolist()}
    if rows is None:
        return columns
    return {k: [v[i] for i in rows] for k, v in columns.items()}


def score_completions(fns: Mapping[str, RewardFn], rollout: Rollout, rows: Sequence[int],
                      completions: Sequence[Any], metrics: dict[str, float] | None = None) -> dict[str, Tensor]:
    """Score extra completions (e.g. intermediate states completed to the end), completion j
    standing for row rows[j]: its prompt and its columns."""
    return compute_rewards(fns, [rollout.prompts[i] for i in rows], completions, reward_columns(rollout, rows),
                           metrics)


def score_rollout(fns: Mapping[str, RewardFn], rollout: Rollout, metrics: dict[str, float] | None = None
                  ) -> tuple[Rollout, dict[str, Tensor], dict[str, Tensor]]:
    """Score every row, auxiliary rows included; return (the rollout without its auxiliary rows,
    their rewards, the auxiliary rows' rewards). Rewards see the rollout's columns plus
    ``group_id`` and ``auxiliary`` (a data-set column of either name is an error)."""
    auxiliary = _auxiliary(rollout)
    rewards = compute_rewards(fns, rollout.prompts, rollout.completions, reward_columns(rollout), metrics)
    if not auxiliary.any():
        return rollout, rewards, {k: v[:0] for k, v in rewards.items()}
    keep = (~auxiliary).nonzero().flatten()
    kept = rollout.select(keep)
    kept.auxiliary = None
    return kept, {k: v[keep] for k, v in rewards.items()}, {k: v[auxiliary] for k, v in rewards.items()}
