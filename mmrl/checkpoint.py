"""Atomic checkpoints: written to a temporary directory, then renamed into place.

``OUTPUT_DIR/checkpoints/step-000123/`` holds accelerate's state (model safetensors, optimizer,
scheduler, RNG states of every process), ``trainer_state.json`` (step, data position, sampler
windows) and ``model/``: the weights or LoRA adapter in the family's own ``from_pretrained``
format. A run killed at any moment leaves either the previous checkpoint or the new one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

PREFIX = "step-"


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"{PREFIX}{step:06d}"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint (temporary directories are ignored)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir()
                  if p.is_dir() and p.name.startswith(PREFIX) and (p / "trainer_state.json").is_file())
    return done[-1] if done else None


def temporary_dir(output_dir: str | Path, step: int) -> Path:
    tmp = Path(output_dir) / "checkpoints" / f".tmp-{PREFIX}{step:06d}"
    return tmp


def publish(tmp: Path, final: Path, trainer_state: dict) -> None:
    """Write the trainer state last, then rename the finished directory into place."""
    with open(tmp / "trainer_state.json", "w") as f:
        json.dump(trainer_state, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def read_trainer_state(path: Path) -> dict:
    return json.loads((path / "trainer_state.json").read_text())
