"""Typed recipes: YAML -> dataclasses, with ``key=value`` overrides (dotted for nested fields).

Unknown keys and values of the wrong type are errors naming the dotted key. The ``policy``
section is typed by the chosen adapter's own ``Config`` dataclass (see `mmrl.core.policy.Policy`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from mmrl.config.peer_names import TABLE as PEER_TABLE
from mmrl.config.peer_names import peer_hint
from mmrl.config.sections import TrainConfig
from mmrl.config.yaml_files import DuplicateKeyError, load_yaml
from mmrl.errors import MissingFileError, UserError


class ConfigError(UserError, ValueError):
    """A recipe or override that does not fit the config schema."""


def _check_value(tp: Any, value: Any, key: str) -> Any:
    """Return `value` converted to type `tp`, or raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        # one alternative (an Optional field): its own message says what was expected
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} fits none of {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_check_value(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return {k: _check_value(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-5` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported field type {tp}")


def from_dict(cls: type, data: dict[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'recipe'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs, problems = {}, []  # every key is checked; the problems are reported together
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            peer = peer_hint(dotted, value)  # a TRL or verl name: mmrl's key
            close = [] if peer else difflib.get_close_matches(str(key), names, n=1)
            hint = f": {peer}" if peer else (f" (did you mean {close[0]!r}?)" if close else "") + \
                f"; TRL's and verl's names: {PEER_TABLE}"
            problems.append(f"unknown config key {dotted!r}{hint}; valid keys: {', '.join(sorted(names))}")
            continue
        try:
            kwargs[key] = _check_value(hints[key], value, dotted)
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(problems))
    return cls(**kwargs)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set ``a.b.c=value`` pairs in a nested mapping; values are parsed as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        try:
            value = load_yaml(raw, key) if raw != "" else ""
        except DuplicateKeyError as e:
            raise ConfigError(f"override {item!r}: {e}") from None
        except yaml.YAMLError as e:
            where = f" ({e.problem})" if getattr(e, "problem", None) else ""
            raise ConfigError(f"override {item!r}: the value {raw!r} is not valid YAML{where}; quote it "
                              f"(key='\"text\"') to pass it as a string") from None
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            if isinstance(node, list):  # a list entry by index, e.g. stages.1.steps=50
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"override {key!r}: {part!r} is not an index of a list of {len(node)}")
                child = node[int(part)]
            else:
                child = node.setdefault(part, {})
            if not isinstance(child, (dict, list)):
                raise ConfigError(f"override {key!r}: {part!r} is not a section")
            node = child
        if isinstance(node, list):
            raise ConfigError(f"override {key!r}: name a field of a list entry (e.g. stages.0.steps=10)")
        node[parts[-1]] = value
    return data


def load_recipe(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"recipe {str(path)!r} does not exist")
    try:
        data = load_yaml(path.read_text()) or {}
    except DuplicateKeyError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: YAML syntax error: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe is a mapping of keys to values, got {type(data).__name__}")
    return parse_config(data, overrides)


def _field_at(cls: type, dotted: str) -> dataclasses.Field | None:
    """The dataclass field a dotted key names under `cls` (None where the key leaves the typed sections)."""
    field = None
    for part in dotted.split("."):
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if part not in fields:
            return None
        field = fields[part]
        cls = typing.get_type_hints(cls).get(part)
    return field


def clear_replaced(data: dict[str, Any], overrides: list[str]) -> None:
    """An override of a field that `replaces` others (its metadata: data.path replaces data.name and
    data.args) drops those others from `data` (they take their defaults), unless the same overrides
    give them too: `data.path=rows.jsonl` over a recipe that names `data.name` trains on the file."""
    given = {item.split("=", 1)[0] for item in overrides if "=" in item}
    for key in sorted(given):
        field = _field_at(TrainConfig, key)
        parent, _, name = key.rpartition(".")
        node = data
        for part in parent.split(".") if parent else ():
            node = node.get(part) if isinstance(node, dict) else None
        if field is None or not isinstance(node, dict) or node.get(name) is None:
            continue
        for sibling in field.metadata.get("replaces", ()):
            if ".".join(filter(None, (parent, sibling))) not in given:
                node.pop(sibling, None)


def parse_config(data: dict[str, Any], overrides: list[str] = ()) -> TrainConfig:
    data = apply_overrides(copy.deepcopy(data), list(overrides))
    clear_replaced(data, list(overrides))
    return from_dict(TrainConfig, data)  # the stages' overrides are checked with the whole recipe (mmrl/train/plan/validate.py)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
