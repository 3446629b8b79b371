"""Reading a user's YAML file strictly: a key given twice in one mapping, at any depth, is an
error naming the key path and both lines (plain YAML keeps the last one and drops the first
without a word: an ``algorithm:`` section written twice loses the first one's settings)."""

from __future__ import annotations

from typing import Any

import yaml


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names one key twice; the message is the key path and both line numbers."""


def _key_path(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _check_unique_keys(node: yaml.Node, where: str) -> None:
    """Raise DuplicateKeyError for the first mapping under `node` that repeats a key."""
    if isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1  # `1` and `"1"` differ
            if key in first_line:
                raise DuplicateKeyError(f"key {_key_path(where, key_node.value)!r} is given twice, on line "
                                        f"{first_line[key]} and on line {line}; give it once")
            first_line[key] = line
        for key_node, value_node in node.value:
            _check_unique_keys(value_node, _key_path(where, str(getattr(key_node, "value", "?"))))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique_keys(item, f"{where}[{i}]")


class UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a mapping key given twice (`DuplicateKeyError`); key paths
    start at `root` (an override's key, say)."""

    root = ""

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        _check_unique_keys(node, self.root)
        return self.construct_document(node)


def load_yaml(text: str, root: str = "") -> Any:
    """`text` parsed as YAML with the safe loader, refusing duplicate keys (named from `root`)."""
    loader = UniqueKeyLoader(text)
    loader.root = root
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
