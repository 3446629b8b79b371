"""Atomic, verifiable checkpoints: written to a temporary directory, then renamed into place.

``OUTPUT_DIR/checkpoints/step-000123/`` holds accelerate's state (model safetensors, optimizer,
scheduler, RNG states of every process), ``trainer_state.json`` (step, data position, sampler
windows), ``model/`` (the weights or LoRA adapter in the family's own ``from_pretrained``
format) and, written last, ``manifest.json``: the size and SHA-256 of every other file. A run
killed at any moment leaves either the previous checkpoint or the new one; a file damaged
afterwards (a truncated copy, a bad disk) is found by `verify` and the run resumes from the newest
checkpoint that verifies. A checkpoint that cannot be finished (a full disk, any error) leaves no
temporary directory behind; a full disk is reported with the directory and the space left.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mmrl.errors import UserError

PREFIX = "step-"
MANIFEST = "manifest.json"
STATE = "trainer_state.json"


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"{PREFIX}{step:06d}"


def published_checkpoints(output_dir: str | Path) -> list[Path]:
    """Every published checkpoint, oldest first (temporary directories are ignored)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / STATE).is_file())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(directory: Path) -> None:
    files = {p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in _files(directory)}
    with open(directory / MANIFEST, "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def verify(directory: Path) -> str | None:
    """None if every file of the manifest is present with its size and checksum; else what is wrong.
    A checkpoint written before manifests existed (no ``manifest.json``) is accepted as it is."""
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as e:
        return f"{manifest} is unreadable ({e})"
    for name, expected in files.items():
        path = directory / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{path} has {size} bytes, the manifest says {expected['size']}"
        if _sha256(path) != expected["sha256"]:
            return f"{path} does not match its checksum in the manifest"
    return None


def latest_checkpoint(output_dir: str | Path, warn: Callable[[str], None] | None = None) -> Path | None:
    """The newest checkpoint that verifies; each newer damaged one is reported through `warn`."""
    for path in reversed(published_checkpoints(output_dir)):
        problem = verify(path)
        if problem is None:
            return path
        if warn is not None:
            warn(f"checkpoint {path} is damaged: {problem}; trying the previous one")
    return None


def temporary_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f".tmp-{PREFIX}{step:06d}"


NEARLY_FULL = 1 << 20  # bytes free below which a failed checkpoint write is the disk's fault


class DiskFull(UserError):
    """A checkpoint could not be written because its disk (or the user's quota) is full."""


def _mount_point(path: Path) -> Path:
    path = path.resolve()
    while not os.path.ismount(path):
        path = path.parent
    return path


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


@contextmanager
def removed_if_unfinished(tmp: Path, output_dir: Path, final: Path, main_process: bool = True) -> Iterator[None]:
    """Around writing checkpoint `final` into `tmp`: on any error remove `tmp` (the main process);
    a full disk or quota (ENOSPC / EDQUOT, or any error while less than `NEARLY_FULL` bytes are free)
    becomes a `DiskFull` naming the disk and its free space."""
    try:
        yield
    except BaseException as e:
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) or \
            shutil.disk_usage(output_dir).free < NEARLY_FULL  # torch.save says RuntimeError('iostream error')
        if main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        if not full:
            raise
        usage = shutil.disk_usage(output_dir)
        kind = "quota" if getattr(e, "errno", None) == errno.EDQUOT else "disk"
        newest = latest_checkpoint(output_dir)
        raise DiskFull(f"checkpoint {final} could not be written: the {kind} holding {output_dir} is full "
                       f"(filesystem mounted at {_mount_point(Path(output_dir))}: {_size(usage.free)} free of "
                       f"{_size(usage.total)} after removing the unfinished checkpoint). The newest checkpoint is "
                       f"{newest}; free some space (or set save_total_limit), then resume=true") from e


def publish(tmp: Path, final: Path, trainer_state: dict) -> None:
    """Write the trainer state, then the manifest (last), then rename the finished directory into place."""
    with open(tmp / STATE, "w") as f:
        json.dump(trainer_state, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    write_manifest(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def read_trainer_state(path: Path) -> dict:
    return json.loads((path / STATE).read_text())


def prune(output_dir: str | Path, keep: int, keep_best: bool = False) -> list[Path]:
    """Delete all but the newest `keep` checkpoints (and, with `keep_best`, the one whose
    ``trainer_state.json`` records the highest ``eval_reward_mean``); return the deleted ones."""
    done = published_checkpoints(output_dir)
    kept = set(done[-keep:]) if keep > 0 else set()
    if keep_best:
        scored = [(read_trainer_state(p).get("eval_reward_mean"), p) for p in done]
        scored = [(s, p) for s, p in scored if s is not None]
        if scored:
            kept.add(max(scored, key=lambda sp: sp[0])[1])
    removed = [p for p in done if p not in kept]
    for path in removed:
        shutil.rmtree(path)
    return removed
