"""Rows as the engine sees them: a lazy sequence over a source's raw rows that applies the data
section's row transforms on access (column renames, answer extraction, conversations, prompt
templates, media paths), so nothing is converted or decoded before it is drawn.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from mmrl.data.chat import is_conversation, split_conversation


class RowError(ValueError):
    """A row that cannot be used: `what` is wrong with its `column` (`detail`: the offending value)."""

    def __init__(self, column: str | None, what: str, detail: str = ""):
        super().__init__(f"column {column!r}: {what}" + (f" ({detail})" if detail else ""))
        self.column, self.what, self.detail = column, what, detail


@dataclass
class RowTransform:
    """What the ``data`` section asks of every row, in this order: rename columns (`columns`,
    source -> target; a dotted source that is not a column reads a field of nested dicts, which
    stay as they are), keep the last match's first group of a regex in a column (`extract`),
    replace an index by that item of a list column (`pick`: column -> list column),
    turn a conversation in the prompt column into a prompt (and the answer column), fill the
    prompt column from `prompt_template`, and make relative paths in `media_columns` absolute
    (against `media_root`, else the data file's directory)."""

    prompt_column: str = "prompt"
    columns: dict[str, str] = field(default_factory=dict)
    extract: dict[str, str] = field(default_factory=dict)
    pick: dict[str, str] = field(default_factory=dict)
    answer_from_conversation: bool = False
    answer_column: str = "answer"
    prompt_template: str | None = None
    media_columns: Sequence[str] = ()
    media_root: Path | None = None

    def __post_init__(self):
        self._patterns = {}
        for column, pattern in self.extract.items():
            try:
                self._patterns[column] = re.compile(pattern, re.DOTALL)
            except re.error as e:
                raise ValueError(f"data.extract.{column}: {pattern!r} is not a regular expression ({e})") from e

    def __call__(self, raw: dict) -> dict:
        row = dict(raw)
        for source, target in self.columns.items():
            if source in row:
                row[target] = row.pop(source)
            elif "." in source:
                found, value = nested_field(row, source)
                if found:
                    row[target] = value
        for column, pattern in self._patterns.items():
            value = row.get(column)
            if isinstance(value, str):
                found = pattern.findall(value)
                if not found:
                    raise RowError(column, f"no match of data.extract pattern {pattern.pattern!r}", repr(value[:80]))
                last = found[-1]
                row[column] = (last[0] if isinstance(last, tuple) else last).strip()
        for column, choices in self.pick.items():
            value, items = row.get(column), row.get(choices)
            if value is not None:
                try:
                    row[column] = items[int(value)]
                except (TypeError, ValueError, IndexError):
                    raise RowError(column, f"not an index into column {choices!r} (data.pick)",
                                   f"{value!r} into {str(items)[:80]}") from None
        prompt = row.get(self.prompt_column)
        if is_conversation(prompt):
            try:
                row[self.prompt_column], answer = split_conversation(prompt, self.answer_from_conversation,
                                                                     self.prompt_column)
            except ValueError as e:
                raise RowError(self.prompt_column, str(e).split(": ", 1)[-1]) from None
            if answer is not None:
                row[self.answer_column] = answer
        if self.prompt_template is not None:
            row[self.prompt_column] = fill_template(self.prompt_template, row)
        if self.media_root is not None:
            for column in self.media_columns:
                if column in row:
                    row[column] = resolve_media(row[column], self.media_root)
        return row


def nested_field(row: dict, dotted: str) -> tuple[bool, Any]:
    """(found, value) of a dotted name inside nested dicts (verl's `reward_model.ground_truth`)."""
    value: Any = row
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return False, None
        value = value[key]
    return True, value


class _RowFormatter(string.Formatter):
    """str.format, but a list field without a conversion is its items joined by newlines
    (``{options}``); ``{options!r}`` is the Python list, ``{options[0]}`` an item."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        if isinstance(value, (list, tuple)):
            return "\n".join(map(str, value))
        return super().format_field(value, format_spec)


def fill_template(template: str, row: dict) -> str:
    """`template` with ``{column}`` fields filled from the row (see `_RowFormatter`)."""
    try:
        return _RowFormatter().format(template, **row)
    except KeyError as e:
        raise RowError(e.args[0], "missing (data.prompt_template names it)") from None


def resolve_media(value: Any, root: Path) -> Any:
    """Relative path strings (alone, in a list, or as a ``{"path"}`` without bytes) joined to
    `root`; everything else (URLs included) as it is."""
    if isinstance(value, str):
        if "://" in value or not value or Path(value).is_absolute():
            return value
        return str(root / value)
    if isinstance(value, list):
        return [resolve_media(v, root) if isinstance(v, (str, dict)) else v for v in value]
    if isinstance(value, dict) and isinstance(value.get("path"), str) and not value.get("bytes") \
            and "array" not in value:
        return {**value, "path": resolve_media(value["path"], root)}
    return value


class Rows(Sequence[dict]):
    """The transformed rows of `raw` (a list of dicts or a ``datasets.Dataset``), optionally a
    subset given by `keep` (raw indices); each row is transformed when it is read."""

    def __init__(self, raw: Sequence[dict], transform: RowTransform, name: str, keep: Sequence[int] | None = None):
        self.raw, self.transform, self.name = raw, transform, name
        self.keep = list(keep) if keep is not None else None

    def __len__(self) -> int:
        return len(self.raw) if self.keep is None else len(self.keep)

    def raw_index(self, i: int) -> int:
        return i if self.keep is None else self.keep[i]

    def raw_row(self, i: int) -> dict:
        return self.raw[self.raw_index(i)]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        return self.transform(self.raw_row(i))

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self[i]

    def without(self, drop: set[int]) -> "Rows":
        """These rows without the raw indices in `drop`."""
        kept = [self.raw_index(i) for i in range(len(self)) if self.raw_index(i) not in drop]
        return Rows(self.raw, self.transform, self.name, kept)
