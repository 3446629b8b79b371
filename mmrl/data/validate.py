"""Row validation before any model loads: every row (``data.validate: all``) or an even sample
(``sample``) of the training and held-out sets is read through the row transforms and checked
for the prompt column, every column a reward needs, the values rewards declare checks for
(``check_columns`` of `register_reward`), and readable media (each adapter names
its media columns and a check that reads only what it must: image and video headers, audio
file info). A required column that no checked row has is named as such, with the columns the
rows have and the closest one. Problems are collected, grouped by (file, column, what is wrong)
with the number of rows that share them, and reported together; ``data.skip_invalid`` drops those
rows instead.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from mmrl.data.rows import RowError, Rows

logger = logging.getLogger("mmrl")

MediaCheck = Callable[[Any], None]  # raises RowError(column, what, detail) when a column's value cannot be read
ValueCheck = Callable[[Any], str | None]  # a value's problem (what is wrong and the fix) or None
SHOWN_ROWS = 3  # rows named per problem in the report


class DataError(ValueError):
    """Rows that fail validation; the message lists every problem."""


@dataclass
class Problem:
    name: str  # the data file or data set
    column: str | None
    what: str
    rows: list[int] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def line(self) -> str:
        shown = ", ".join(f"row {r}" + (f" ({d})" if d else "") for r, d in
                          zip(self.rows[:SHOWN_ROWS], self.details[:SHOWN_ROWS]))
        more = f" and {len(self.rows) - SHOWN_ROWS} more" if len(self.rows) > SHOWN_ROWS else ""
        column = f"column {self.column!r}" if self.column else "row"
        return f"{self.name}: {column}: {self.what}: {len(self.rows)} row(s): {shown}{more}"


def _sample(n: int, mode: str, size: int) -> Iterable[int]:
    if mode == "all" or n <= size:
        return range(n)
    step = n / size
    return sorted({int(k * step) for k in range(size)})


def prompt_problem(prompt: Any) -> str | None:
    """What is wrong with a prompt value (a non-empty text, or a non-empty list of chat messages), or None."""
    if isinstance(prompt, str):
        return "empty prompt" if not prompt.strip() else None
    if isinstance(prompt, (list, tuple)):
        return "empty message list" if not prompt else None
    return f"a prompt is text or a list of chat messages, not {type(prompt).__name__}"


def check_rows(rows: Rows, prompt_column: str, required: Mapping[str, str],
               media: Mapping[str, MediaCheck], mode: str = "all", sample_size: int = 1000,
               values: Sequence[tuple[str, ValueCheck]] = ()) -> list[Problem]:
    """Problems of `rows`: a missing or empty prompt (or one that is neither text nor a message
    list: a number), a missing (or None) column in `required`
    (column -> who needs it, e.g. "reward 'iou'"), a value a check in `values` ((column, check)
    pairs) refuses, a media value its check refuses, a row the transforms refuse. Media checks
    are cached by value, so a file shared by many rows is read once."""
    problems: dict[tuple, Problem] = {}
    seen: dict[Any, RowError | None] = {}
    keys: set[str] = set()  # every column some checked row has

    def add(index: int, column: str | None, what: str, detail: str = "") -> None:
        problem = problems.setdefault((column, what), Problem(rows.name, column, what))
        problem.rows.append(index)
        problem.details.append(detail)

    for i in _sample(len(rows), mode, sample_size):
        index = rows.raw_index(i)
        try:
            row = rows[i]
        except RowError as e:
            add(index, e.column, e.what, e.detail)
            continue
        keys.update(row)
        prompt = row.get(prompt_column)
        if prompt is None:
            add(index, prompt_column, "missing (the prompt column, data.prompt_column)")
        elif prompt_problem(prompt) is not None:
            add(index, prompt_column, prompt_problem(prompt), f"{prompt!r:.120}")
        for column, who in required.items():
            if row.get(column) is None:
                add(index, column, f"missing (needed by {who})")
        for column, check in values:
            value = row.get(column)
            problem = None if value is None else check(value)
            if problem is not None:
                add(index, column, problem, f"{value!r:.120}")
        for column, check in media.items():
            value = row.get(column)
            if value is None:
                continue
            key = (column, value) if isinstance(value, str) else None  # a file shared by many rows is read once
            if key is None or key not in seen:
                try:
                    check(value)
                    error = None
                except RowError as e:
                    error = e
                if key is not None:
                    seen[key] = error
            else:
                error = seen[key]
            if error is not None:
                add(index, column, error.what, error.detail)
    return _name_absent_columns(list(problems.values()), required, keys)


def _name_absent_columns(problems: list[Problem], required: Mapping[str, str], keys: set[str]) -> list[Problem]:
    """`problems` with each required column that no row has (none of `keys`) said to be absent, with
    the columns the rows have and the closest one."""
    for problem in problems:
        who = required.get(problem.column)
        if who is not None and problem.column not in keys and problem.what == f"missing (needed by {who})":
            close = difflib.get_close_matches(problem.column, sorted(keys), n=1)
            problem.what = (f"no row has this column (needed by {who}); the rows' columns: {', '.join(sorted(keys))}"
                            + (f"; did you mean {close[0]!r}?" if close else ""))
    return problems


def validate(sets: Iterable[Rows], prompt_column: str, required: Mapping[str, str],
             media: Mapping[str, MediaCheck], mode: str, sample_size: int, skip_invalid: bool,
             values: Sequence[tuple[str, ValueCheck]] = (), first_required: Mapping[str, str] = {}) -> list[Rows]:
    """Check every set (`first_required`: columns only the first, the training set, needs); raise
    DataError listing every problem, or (`skip_invalid`) return the sets without the rows that have
    one, logging how many were dropped."""
    out, report = [], []
    for k, rows in enumerate(sets):
        if mode == "off" or len(rows) == 0:
            out.append(rows)
            continue
        needed = {**required, **first_required} if k == 0 else required
        problems = check_rows(rows, prompt_column, needed, media, mode, sample_size, values)
        bad = {r for p in problems for r in p.rows}
        if problems and skip_invalid:
            logger.warning("data: dropped %d of %d rows of %s (data.skip_invalid):\n  %s", len(bad), len(rows),
                           rows.name, "\n  ".join(p.line() for p in problems))
            rows = rows.without(bad)
        else:
            report.extend(problems)
        out.append(rows)
    if report:
        total = sum(len(p.rows) for p in report)
        raise DataError(f"data: {len(report)} problem(s) in {total} row-column(s) (row numbers count from 0 in "
                        f"each file; data.skip_invalid=true drops these rows):\n  "
                        + "\n  ".join(p.line() for p in report))
    return out


def reward_columns_needed(reward_fns: Mapping[str, Callable], bindings: Mapping[str, Mapping[str, str]],
                          provided: Iterable[str] = ()) -> dict[str, str]:
    """column -> "reward 'NAME'" for each required argument of each reward (a parameter without a
    default that is not bound by recipe args), through its column bindings; arguments the
    engine or the adapter provide (`provided`) excluded."""
    import inspect
    needed: dict[str, str] = {}
    skip = {"prompts", "completions", *provided}
    for name, fn in reward_fns.items():
        bound = getattr(fn, "keywords", None) or {}
        target = getattr(fn, "func", fn)
        for param in inspect.signature(target).parameters.values():
            if (param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL) or param.default is not param.empty
                    or param.name in skip or param.name in bound):
                continue
            column = bindings.get(name, {}).get(param.name, param.name)
            needed.setdefault(column, f"reward {name!r}" + (f" as {param.name!r}" if column != param.name else ""))
    return needed
