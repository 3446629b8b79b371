"""A sweep's grid: the `--grid` axes and the `--cell` list as cells, each cell run for every seed
(a `Run`: its cell, settings and seed, and the directory it writes), and `--shard i/n`."""

from __future__ import annotations

import hashlib
import itertools
import re
import shlex
from dataclasses import dataclass

from mmrl.errors import UserError


@dataclass(frozen=True)
class Run:
    cell: int
    overrides: tuple[str, ...]  # the cell's key=value settings
    seed: int

    @property
    def dirname(self) -> str:
        slug = re.sub(r"[^A-Za-z0-9.=_-]+", "_", "_".join(o.split(".")[-1] for o in self.overrides))[:80]
        digest = hashlib.sha256("\n".join(self.overrides).encode()).hexdigest()[:8]
        return f"{slug or 'base'}-{digest}/seed-{self.seed}"


def split_values(text: str) -> list[str]:
    """V1,V2,... split at the commas outside brackets (a value may be a YAML list or mapping)."""
    values, depth, current = [], 0, ""
    for ch in text:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            values.append(current)
            current = ""
        else:
            current += ch
    values.append(current)
    return values


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    grid, seen = [], set()
    for item in items:
        key, sep, raw = item.partition("=")
        values = split_values(raw)
        if not sep or not key or any(v == "" for v in values):
            raise UserError(f"--grid {item!r} is not of the form KEY=V1,V2,...")
        if key in seen:
            raise UserError(f"--grid names {key!r} twice")
        seen.add(key)
        grid.append((key, values))
    return grid


def parse_cells(items: list[str]) -> list[tuple[str, ...]]:
    """`--cell "k=v k2=v2"`: one cell's settings (methods that differ in several keys)."""
    out = []
    for item in items:
        overrides = tuple(shlex.split(item))
        if not overrides or any("=" not in o or o.startswith("=") for o in overrides):
            raise UserError(f"--cell {item!r} is not a space-separated list of key=value")
        out.append(overrides)
    return out


def cells(grid: list[tuple[str, list[str]]], bundles: list[tuple[str, ...]] = ()) -> list[tuple[str, ...]]:
    """The product of the `--cell` list (one axis) and the `--grid` axes."""
    axes = ([list(bundles)] if bundles else []) + [[(f"{k}={v}",) for v in values] for k, values in grid]
    return [sum(combo, ()) for combo in itertools.product(*axes)]


def parse_shard(text: str | None) -> tuple[int, int]:
    if text is None:
        return 0, 1
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise UserError(f"--shard {text!r} must be i/n with 0 <= i < n")
    return int(m.group(1)), int(m.group(2))


def plan(grid_cells: list[tuple[str, ...]], seeds: int) -> list[Run]:
    """Cell-major, so that parallel runs start on different seeds' warm starts."""
    return [Run(c, overrides, s) for c, overrides in enumerate(grid_cells) for s in range(seeds)]
