"""A benchmark's generated samples on disk, shard by shard, so that scoring can run later or elsewhere.

``OUT/bench/NAME/shards/I-of-N/`` holds ``samples.jsonl`` (one line per sample: ``id``, ``k``,
``seed``, ``prompt``, ``completion``, ``columns``), ``media/`` (a completion that is not text, as
its viewers see it, `Policy.sample_medium`: an image as PNG, audio as 32-bit float WAV, a video as
``.npz`` of uint8 [T, H, W, 3] frames and its fps) and, written last, ``done.json`` (what the shard
was generated with). A shard with ``done.json`` is finished and a rerun skips it; one without is
generated again from its start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from mmrl.core.media import Medium, MediumOf
from mmrl.errors import UserError

DONE = "done.json"


def shard_dir(folder: Path, shard: tuple[int, int]) -> Path:
    return folder / "shards" / f"{shard[0]}-of-{shard[1]}"


def _plain(value: Any) -> Any:
    """A JSON value of a column (tensors and arrays as lists; other objects as their type's name)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return f"<{type(value).__name__}>"


def _write_medium(item: Medium, media: Path, stem: str) -> dict[str, Any]:
    media.mkdir(parents=True, exist_ok=True)
    if item.kind == "image":
        from PIL import Image
        Image.fromarray(item.data).save(media / f"{stem}.png")
        return {"kind": "image", "file": f"media/{stem}.png"}
    if item.kind == "audio":
        import soundfile
        soundfile.write(media / f"{stem}.wav", item.data, int(item.rate), subtype="FLOAT")
        return {"kind": "audio", "file": f"media/{stem}.wav", "sampling_rate": int(item.rate)}
    np.savez_compressed(media / f"{stem}.npz", frames=item.data, fps=item.rate)
    return {"kind": "video", "file": f"media/{stem}.npz", "fps": item.rate}


def sample_record(sample: dict, folder: Path, medium_of: MediumOf) -> dict[str, Any]:
    """One sample as its JSON line, its completion written to ``media/`` when it is not text."""
    columns = {k: _plain(v) for k, v in sample["columns"].items()}
    item = medium_of(sample["completion"], sample["columns"])
    completion = item.data if item.kind == "text" else _write_medium(item, folder / "media", f"{sample['id']}-{sample['k']}")
    return {"id": sample["id"], "k": sample["k"], "seed": sample["seed"], "prompt": _plain(sample["prompt"]),
            "completion": completion, "columns": columns}


def _read_completion(value: Any, folder: Path) -> tuple[Any, dict[str, Any]]:
    """A completion as the scorers take it (text, a PIL image, {"array", "sampling_rate"}, or uint8
    [T, H, W, 3] video frames) and the columns its file carries (a video's ``fps``)."""
    if not isinstance(value, dict):
        return value, {}
    path = folder / value["file"]
    if value["kind"] == "image":
        from PIL import Image
        with Image.open(path) as im:
            return im.convert("RGB"), {}
    if value["kind"] == "audio":
        import soundfile
        array, rate = soundfile.read(path, dtype="float32")
        return {"array": array, "sampling_rate": rate}, {}
    with np.load(path) as data:
        return data["frames"], {"fps": float(data["fps"])}


def read_samples(folder: Path) -> list[dict]:
    """The samples of a finished shard, their media read back (a column the row already has wins
    over the one its file carries)."""
    out = []
    for n, line in enumerate((folder / "samples.jsonl").read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{folder / 'samples.jsonl'}:{n}: not valid JSON ({e.msg}); generate the shard again") from None
        record["completion"], file_columns = _read_completion(record["completion"], folder)
        record["columns"] = {**file_columns, **record["columns"]}
        out.append(record)
    return out


def finished(folder: Path, meta: dict) -> bool:
    """Whether the shard is finished with the same settings `meta`; a finished shard generated with
    others is a UserError (a rerun must not mix them)."""
    done = folder / DONE
    if not done.is_file():
        return False
    before = json.loads(done.read_text())
    if before.get("meta") != meta:
        changed = sorted(k for k in {*meta, *before.get("meta", {})} if meta.get(k) != before.get("meta", {}).get(k))
        raise UserError(f"{folder} was generated with other settings ({', '.join(changed)}); give another --out, "
                        f"or delete the folder to generate it again")
    return True


def mark_finished(folder: Path, meta: dict, count: int) -> None:
    (folder / DONE).write_text(json.dumps({"meta": meta, "samples": count}, indent=1))
