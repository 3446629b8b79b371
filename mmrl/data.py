"""Prompt data sets: a registered builder (``data.name``) or JSON / JSONL files (``data.path``).

Rows are dicts; ``data.prompt_column`` is what the adapter receives, every column reaches the
rewards by name (``answer``, ``reference``, ``boxes``, ...).
"""

from __future__ import annotations

import json
from pathlib import Path

from .config import DataConfig
from .registry import DATASETS


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a ``.jsonl`` (one object per line) or ``.json`` (a list of objects) file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    text = path.read_text()
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from e
    else:
        rows = json.loads(text)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: expected a list of JSON objects")
    return rows


def load_data(cfg: DataConfig) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows); either comes from a registered builder or from files."""
    if (cfg.name is None) == (cfg.path is None):
        raise ValueError("data: give exactly one of data.name (a registered data set) or data.path")
    if cfg.name is not None:
        built = DATASETS.get(cfg.name)(**cfg.args)
        train, held_out = built["train"], built.get("eval", [])
    else:
        train = read_rows(cfg.path)
        held_out = read_rows(cfg.eval_path) if cfg.eval_path else []
    for split, rows in (("train", train), ("eval", held_out)):
        for i, row in enumerate(rows):
            if cfg.prompt_column not in row:
                raise KeyError(f"data ({split}) row {i} has no prompt column {cfg.prompt_column!r}; "
                               f"columns: {sorted(row)}")
    if not train:
        raise ValueError("data: the training set is empty")
    return train, held_out
