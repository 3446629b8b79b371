"""A registry name in a recipe checked against the registry: an unknown one is reported with the
closest known name and the list of registered ones."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from mmrl.registry import Registry


def unknown_name(kind: str, key: str, value: Any, known: Iterable[str]) -> str:
    known = sorted(known)
    close = difflib.get_close_matches(str(value), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{key}: {value!r} is not a registered {kind}{hint}; registered: {', '.join(known) or 'none'}"


def check_name(problems: list[str], registry: Registry, key: str, value: Any, extra: Iterable[str] = ()) -> bool:
    if value in registry or value in extra:
        return True
    problems.append(unknown_name(registry.kind, key, value, [*registry.names(), *extra]))
    return False
