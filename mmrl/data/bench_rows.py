"""A benchmark's rows: its source (the Hugging Face hub data set it names, or a local copy in the same
format: a file, a folder, a ``save_to_disk`` folder) read through `open_source`, mapped by the
benchmark's `read_rows`, checked (a unique string ``id`` per row), cut to a smoke subset, and split
into shards; all before any model loads."""

from __future__ import annotations

from typing import Any, Mapping

from mmrl.core.benchmark import Benchmark, Row
from mmrl.data.sources import open_source
from mmrl.errors import UserError


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"i/n"`` as (i, n) with 0 <= i < n; None is the whole set (0, 1)."""
    if text is None:
        return 0, 1
    index, slash, count = str(text).partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not slash or not 0 <= i < n:
        raise UserError(f"--shard {text!r}: expected i/n with 0 <= i < n, e.g. 0/4")
    return i, n


def shard_rows(rows: list[Row], shard: tuple[int, int]) -> list[Row]:
    """Shard i of n: rows i, i + n, i + 2n, ... (every row in exactly one shard)."""
    i, n = shard
    return rows[i::n]


def benchmark_rows(bench: Benchmark, options: Mapping[str, Any], data: str | None = None, split: str | None = None,
                   num_prompts: int | None = None) -> tuple[list[Row], int]:
    """(the rows scored: the first `num_prompts` of the source's order, or all; how many the source
    holds). `data`: a local copy replacing the hub source; `split`: another split than the benchmark's."""
    path, chosen = data or bench.source, split or bench.split
    where = f"benchmark {bench.name}: {path}" + (f" (split {chosen})" if chosen else "")
    try:
        source = open_source(path, chosen if data is None or split else None, None if data else bench.subset)
        rows = bench.read_rows(source.rows, options)
    except (ValueError, FileNotFoundError, KeyError) as e:
        raise UserError(f"{where}: {e.args[0] if e.args else e}") from None
    seen: set[str] = set()
    for n, row in enumerate(rows):
        key = row.get("id")
        if not isinstance(key, str) or not key:
            raise UserError(f"{where}: row {n} has no string id ({key!r})")
        if key in seen:
            raise UserError(f"{where}: row {n} repeats the id {key!r}")
        seen.add(key)
    if not rows:
        raise UserError(f"{where}: no rows")
    if num_prompts is not None and num_prompts < 1:
        raise UserError(f"--num-prompts {num_prompts}: must be >= 1")
    return rows[:num_prompts] if num_prompts else rows, len(rows)
