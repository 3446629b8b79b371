"""Prompt data sets: a registered builder (``data.name``) or data from files, directories or the
hub (``data.path``, see `sources`); rows are transformed when read (`rows`) and validated
before any model loads (`validate`).

Rows are dicts; ``data.prompt_column`` is what the adapter receives, every column reaches the
rewards by name (``answer``, ``reference``, ``boxes``, ...), or through a reward's column
bindings (``rewards.NAME.columns``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from mmrl.config.sections import DataConfig
from mmrl.data.rows import RowError, Rows, RowTransform
from mmrl.data.sources import open_source, read_rows
from mmrl.data.validate import DataError, MediaCheck, ValueCheck, reward_columns_needed, validate
from mmrl.registry import DATASETS

__all__ = ["DataError", "RowError", "Rows", "load_data", "read_rows", "reward_columns_needed"]


def _transform(cfg: DataConfig, media_columns: Mapping[str, MediaCheck], base_dir: Path | None) -> RowTransform:
    root = Path(cfg.media_root) if cfg.media_root else base_dir
    return RowTransform(prompt_column=cfg.prompt_column, columns=dict(cfg.columns), extract=dict(cfg.extract), pick=dict(cfg.pick),
                        answer_from_conversation=cfg.answer_from_conversation, answer_column=cfg.answer_column,
                        prompt_template=cfg.prompt_template, media_columns=list(media_columns), media_root=root)


def load_data(cfg: DataConfig, media: Mapping[str, MediaCheck] | None = None,
              required: Mapping[str, str] | None = None,
              values: Sequence[tuple[str, ValueCheck]] = (),
              train_required: Mapping[str, str] | None = None) -> tuple[Rows, Rows]:
    """(train rows, held-out rows), validated (`data.validate`): `media` maps each media column to
    its check (from the adapter), `required` each column a reward (or the adapter) needs to who
    needs it, `train_required` those only the training rows need (the warm start's target),
    `values` pairs a column with a check of its values (the rewards' `column_checks`)."""
    media = dict(media or {})
    if (cfg.name is None) == (cfg.path is None):
        raise ValueError("data: give exactly one of data.name (a registered data set) or data.path")
    if cfg.validate_rows < 1:
        raise ValueError(f"data.validate_rows={cfg.validate_rows} must be >= 1")
    if cfg.name is not None:
        built = DATASETS.get(cfg.name)(**cfg.args)
        transform = _transform(cfg, media, None)
        train = Rows(built["train"], transform, f"data set {cfg.name!r} (train)")
        held_out = Rows(built.get("eval", []), transform, f"data set {cfg.name!r} (eval)")
    else:
        source = open_source(cfg.path, cfg.split, cfg.subset)
        train = Rows(source.rows, _transform(cfg, media, source.base_dir), source.name)
        if cfg.eval_path:
            held = open_source(cfg.eval_path, cfg.eval_split or cfg.split, cfg.subset)
            name = held.name if cfg.eval_path != cfg.path else f"{held.name} (split {cfg.eval_split!r})"
            held_out = Rows(held.rows, _transform(cfg, media, held.base_dir), name)
        else:
            held_out = Rows([], _transform(cfg, media, None), "eval")
    if len(train) == 0:
        raise ValueError(f"data: the training set {train.name} is empty")
    train, held_out = validate([train, held_out], cfg.prompt_column, required or {}, media, cfg.validate,
                               cfg.validate_rows, cfg.skip_invalid, values, train_required or {})
    if len(train) == 0:
        raise ValueError(f"data: no row of {train.name} is valid (data.skip_invalid dropped them all)")
    return train, held_out
