"""Where rows come from: a data file (JSON, JSONL, CSV, parquet, arrow), a directory written by
``datasets.save_to_disk``, a directory of data files, or a Hugging Face hub data set id.

JSON / JSONL rows are read as Python dicts (their text is small next to the media they name);
every other source stays an Arrow-backed ``datasets.Dataset``, read a row at a time, so a large
set (with embedded images, say) never sits decoded in memory. Hub ids go through
``datasets.load_dataset``: its cache and ``HF_HUB_OFFLINE`` behave as usual.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

JSON_SUFFIXES = (".json", ".jsonl")
# file suffix -> the `datasets` builder that reads it
BUILDERS = {".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
DATA_SUFFIXES = JSON_SUFFIXES + tuple(BUILDERS)


@dataclass
class Source:
    """Rows (a list of dicts, or a ``datasets.Dataset``), the name problems are reported under,
    and the directory relative media paths resolve against (None for a hub data set)."""

    rows: Sequence[dict]
    name: str
    base_dir: Path | None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's mapping; a key given twice is an error (json keeps the last one silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is given twice in one object")
        out[key] = value
    return out


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a ``.jsonl`` (one object per line) or ``.json`` (a list of objects) file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); a binary data file "
                         f"needs its own suffix ({', '.join(BUILDERS)})") from e
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line, object_pairs_hook=_unique_keys))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from e
                except ValueError as e:
                    raise ValueError(f"{path}:{n}: {e}") from None
    else:
        try:
            rows = json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from e
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: expected a list of JSON objects")
    return rows


def undecoded(dataset: Any) -> Any:
    """`dataset` with its image / audio / video columns cast to ``decode=False``: rows then carry
    ``{"bytes", "path"}`` dicts that the adapter decodes when the row is drawn."""
    features = getattr(dataset, "features", None) or {}
    for name, feature in features.items():
        if getattr(feature, "decode", False) is True and hasattr(feature, "decode"):
            from dataclasses import replace
            dataset = dataset.cast_column(name, replace(feature, decode=False))
    return dataset


def _pick_split(dataset: Any, split: str | None, where: str) -> Any:
    """One split of a ``DatasetDict`` (`split`, else its only one, else ``train``)."""
    from datasets import DatasetDict
    if not isinstance(dataset, DatasetDict):
        if split is not None and split != "train":
            raise ValueError(f"{where}: data.split={split!r}, but this data set has no splits")
        return dataset
    if split is None:
        split = next(iter(dataset)) if len(dataset) == 1 else "train"
    if split not in dataset:
        raise ValueError(f"{where}: no split {split!r}; splits: {', '.join(dataset)}")
    return dataset[split]


def _data_files(directory: Path) -> list[Path]:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES)
    kinds = {p.suffix if p.suffix not in JSON_SUFFIXES else ".json" for p in files}
    if not files:
        raise ValueError(f"data directory {str(directory)!r} holds no data files ({', '.join(DATA_SUFFIXES)}) "
                         f"and was not written by datasets.save_to_disk")
    if len(kinds) > 1:
        raise ValueError(f"data directory {str(directory)!r} mixes file types ({', '.join(sorted(kinds))}); "
                         f"point data.path at one file or one type")
    return files


def _from_files(files: list[Path], split: str | None, where: str) -> Sequence[dict]:
    suffix = files[0].suffix
    if suffix in JSON_SUFFIXES:
        return [row for f in files for row in read_rows(f)]
    from datasets import load_dataset
    try:
        loaded = load_dataset(BUILDERS[suffix], data_files=[str(f) for f in files], split="train")
    except Exception as e:  # the builder's own message, with the file named
        raise ValueError(f"{where}: cannot be read as {suffix[1:]} ({type(e).__name__}: {e})") from e
    if split not in (None, "train"):
        raise ValueError(f"{where}: data.split={split!r}, but a data file has no splits")
    return undecoded(loaded)


def is_hub_id(path: str) -> bool:
    """Whether `path`, where no file or directory is, names a hub data set (``owner/name``, no data
    file suffix) rather than a local file or directory that is missing."""
    return not (Path(path).suffix in DATA_SUFFIXES or path.startswith((".", "/", "~")) or path.count("/") > 1)


def open_source(path: str, split: str | None = None, subset: str | None = None) -> Source:
    """The rows at `path` (see the module docstring); `split` / `subset` pick a part of a data set
    with splits or configurations."""
    local = Path(path)
    if local.is_file():
        if local.suffix not in DATA_SUFFIXES:
            raise ValueError(f"data file {path!r}: unknown type {local.suffix!r}; "
                             f"expected one of {', '.join(DATA_SUFFIXES)}")
        return Source(_from_files([local], split, path), path, local.parent)
    if local.is_dir():
        if (local / "dataset_dict.json").is_file() or (local / "dataset_info.json").is_file() \
                or (local / "state.json").is_file():
            from datasets import load_from_disk
            return Source(undecoded(_pick_split(load_from_disk(str(local)), split, path)), path, local)
        return Source(_from_files(_data_files(local), split, path), path, local)
    if not is_hub_id(path):
        raise FileNotFoundError(f"data file {path!r} does not exist")
    from datasets import load_dataset
    try:
        loaded = load_dataset(path, subset, split=split)
    except Exception as e:
        raise ValueError(f"data set {path!r} (subset {subset!r}, split {split!r}): no such local file or "
                         f"directory, and datasets.load_dataset failed: {type(e).__name__}: {e}") from e
    return Source(undecoded(_pick_split(loaded, split, path)), path, None)
