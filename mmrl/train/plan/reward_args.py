"""A reward's ``rewards.NAME.args`` against its function, before anything loads: each argument one
its signature names (an argument it does not name is an error even when it takes ``**kwargs``,
with the closest name as a suggestion), and each value one its annotation allows where that is a
``typing.Literal`` (``mode: Literal["auto", "exact"]``, optionally ``| None``), with the allowed
values and the closest one. A Literal member ending in ``_K`` stands for its prefix followed by
a whole number from 1 (``every_K``: ``every_1``, ``every_2``, ...)."""

from __future__ import annotations

import difflib
import inspect
import re
import types
import typing
from typing import Any, Callable, Literal

NUMBERED = re.compile(r"(.+_)K")  # a Literal member standing for PREFIX_1, PREFIX_2, ...


def argument_problems(name: str, fn: Callable[..., Any], args: dict[str, Any]) -> list[str]:
    """What is wrong with reward `name`'s recipe arguments `args` for its function `fn`."""
    params = _signature(fn).parameters.values()
    accepted = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and p.name not in ("prompts", "completions")]
    allowed = {p.name: choices for p in params if (choices := literal_choices(p.annotation)) is not None}
    problems = []
    for arg, value in args.items():
        if arg not in accepted:
            problems.append(f"rewards.{name}.args.{arg}={value!r}: reward {name!r} takes no argument {arg!r}"
                            f"{_closest(arg, accepted)}; its arguments: {', '.join(accepted) or 'none'}")
        elif arg in allowed and not any(_allows(member, value) for member in allowed[arg]):
            shown = [m for m in allowed[arg] if m is not None]
            problems.append(f"rewards.{name}.args.{arg}={value!r} is not one of {', '.join(map(str, shown))}"
                            + (" (or null)" if None in allowed[arg] else "")
                            + _closest(str(value), [str(m) for m in shown]))
    return problems


def literal_choices(annotation: Any) -> tuple | None:
    """The values a ``Literal[...]`` annotation (or a union of Literals and None) allows; None for
    any other annotation (not checked)."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [literal_choices(a) if a is not type(None) else (None,) for a in typing.get_args(annotation)]
        return None if any(m is None for m in members) else tuple(v for m in members for v in m)
    return None


def _allows(member: Any, value: Any) -> bool:
    numbered = NUMBERED.fullmatch(member) if isinstance(member, str) else None
    if numbered and isinstance(value, str) and value.startswith(numbered.group(1)):
        count = value[len(numbered.group(1)):]
        return count.isdigit() and int(count) >= 1
    return type(member) is type(value) and member == value


def _closest(given: str, names: list[str]) -> str:
    close = difflib.get_close_matches(given, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    """The signature with its annotations evaluated (left as written where a name cannot be)."""
    try:
        return inspect.signature(fn, eval_str=True)
    except (NameError, TypeError, SyntaxError):
        return inspect.signature(fn)
