"""``mmrl explain KEY [--task T]``: a recipe key's help text, type, default and allowed values.

Every config field declares its help where it is declared, ``field(default=...,
metadata={"help": ...})``; a field whose value names a registered piece (an estimator, a sampler)
also declares ``"choices": "module:NAME"`` (comma-separated for several), NAME being a `Registry`
or a tuple / list / dict / string of allowed values, imported only when asked. ``Literal`` types
give their values directly. The ``policy`` section is typed by the adapter's own ``Config``, so
``policy.*`` keys are looked up in the adapter named by ``--task`` (default: ``causal_lm``).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
import typing
from typing import Any, Iterator, Literal

from mmrl.config.peer_names import peer_hint
from mmrl.config.parse import ConfigError
from mmrl.config.sections import TrainConfig
from mmrl.registry import ADAPTERS

DEFAULT_TASK = TrainConfig.task


def _options(tp: Any) -> list[Any]:
    """The members of `tp` other than None (a union's alternatives, or `tp` itself)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _section_type(tp: Any) -> type | None:
    """The dataclass a field holds, if any (directly or as an Optional)."""
    found = [a for a in _options(tp) if dataclasses.is_dataclass(a)]
    return found[0] if found else None


def _mapping_value(tp: Any) -> Any:
    """The value type of a `dict[str, V]` field, or None."""
    for a in _options(tp):
        if typing.get_origin(a) is dict:
            return typing.get_args(a)[1]
    return None


def type_name(tp: Any) -> str:
    """A readable name of a field type: ``int``, ``list[int] | None``, ``'a' | 'b'``."""
    if tp is type(None):
        return "None"
    if tp is Any:
        return "any"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (list, dict, tuple):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


def policy_config(task: str) -> type:
    """The `Config` dataclass of the registered adapter `task`."""
    return ADAPTERS.get(task).Config


def _resolve(spec: str) -> list[str]:
    """Allowed values from a ``module:NAME[,module:NAME]`` choices spec."""
    out: list[str] = []
    for part in spec.split(","):
        module, name = part.strip().split(":")
        value = getattr(importlib.import_module(module), name)
        if isinstance(value, str):
            out.append(value)
        elif hasattr(value, "names"):  # a Registry
            out.extend(value.names())
        else:
            out.extend(str(v) for v in value)
    return out


def allowed_values(f: dataclasses.Field, tp: Any) -> list[str]:
    """Literal values of the field's type, plus the names its ``choices`` metadata points to."""
    values = [repr(v) if not isinstance(v, str) else v
              for a in _options(tp) if typing.get_origin(a) is Literal for v in typing.get_args(a)]
    if "choices" in f.metadata:
        values += [v for v in _resolve(f.metadata["choices"]) if v not in values]
    return values


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def lookup(key: str, task: str | None = None) -> tuple[str, dataclasses.Field | None, Any, type | None]:
    """Walk the dotted `key` from `TrainConfig`: (the key, its field (None for a dict entry such as
    ``rewards.NAME``), its type, the section dataclass it is or holds (None for a leaf))."""
    cls: type = TrainConfig
    f: dataclasses.Field | None = None
    tp: Any = TrainConfig
    walked: list[str] = []
    for part in key.split("."):
        if cls is None:
            mapping = _mapping_value(tp)
            if mapping is None:
                raise ConfigError(f"{'.'.join(walked)} is a {type_name(tp)}, it has no key {part!r}")
            walked.append(part)
            f, tp, cls = None, mapping, _section_type(mapping)
            continue
        fields = {x.name: x for x in dataclasses.fields(cls)}
        if part not in fields:
            where = ".".join(walked) or "the recipe"
            peer = peer_hint(key, None)
            raise ConfigError(f"unknown config key {'.'.join(walked + [part])!r}{': ' + peer if peer else ''}; "
                              f"keys of {where}: {', '.join(sorted(fields))}")
        f, tp = fields[part], typing.get_type_hints(cls)[part]
        walked.append(part)
        if cls is TrainConfig and part == "policy":
            cls = policy_config(task or DEFAULT_TASK)
            tp = cls
        else:
            cls = _section_type(tp)
    return ".".join(walked), f, tp, cls


def explain(key: str, task: str | None = None) -> str:
    """The text `mmrl explain KEY` prints."""
    name, f, tp, section = lookup(key, task)
    lines = [name]
    if name.split(".")[0] == "policy":
        lines[0] += f"   (task: {task or DEFAULT_TASK})"
    if f is not None and f.metadata.get("help"):
        lines.append(f"  {f.metadata['help']}")
    if section is not None:
        lines.append(f"  section {section.__name__}; its keys:")
        for sub in dataclasses.fields(section):
            summary = re.split(r"\.\s+(?=[A-Z])", sub.metadata.get("help", ""))[0].rstrip(".")
            lines.append(f"    {sub.name}: {summary}")
        return "\n".join(lines)
    lines.append(f"  type: {type_name(tp)}")
    if f is not None:
        default = default_of(f)
        lines.append(f"  default: {'(required)' if default is dataclasses.MISSING else _yaml(default)}")
        allowed = allowed_values(f, tp)
        if allowed:
            lines.append(f"  allowed: {', '.join(allowed)}")
    return "\n".join(lines)


def _yaml(value: Any) -> str:
    """A default as a recipe would spell it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if dataclasses.is_dataclass(value):
        return "(section)"
    return repr(value) if isinstance(value, str) else str(value)


def config_classes(roots: typing.Iterable[type]) -> Iterator[type]:
    """Every dataclass reachable from `roots` through field types (sections, Optional sections,
    dict and list values), each once."""
    seen: set[type] = set()
    stack = list(roots)
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        yield cls
        for tp in typing.get_type_hints(cls).values():
            for a in _options(tp):
                for inner in (a, *typing.get_args(a)):
                    for x in _options(inner):
                        if dataclasses.is_dataclass(x) and isinstance(x, type):
                            stack.append(x)
