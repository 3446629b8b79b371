"""One run per output directory.

A new run refuses a directory that holds another run's files (naming them); ``overwrite=true``
clears those files first; ``resume=true`` continues the run from its newest good checkpoint (an
error when there is none); ``resume=auto`` continues if there is a checkpoint and starts a new run
otherwise, saying which. Everything here runs before any model, data set or reward model loads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from mmrl.errors import UserError
from mmrl.train import checkpoint as ckpt

# Files and folders a run writes into its output directory; the first three mark a run.
RUN_MARKERS = ("metrics.jsonl", "config.json", "checkpoints")
RUN_OUTPUTS = RUN_MARKERS + ("tensorboard", "plots", "wandb", "summary.json", "before.json")


def run_files(output_dir: Path) -> list[str]:
    """The run markers present in `output_dir` (folders with a trailing slash)."""
    return [name + ("/" if (output_dir / name).is_dir() else "") for name in RUN_MARKERS
            if (output_dir / name).exists()]


def check_writable(output_dir: Path) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"output_dir {str(output_dir)!r} is a file, not a directory")
    existing = output_dir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"output_dir {str(output_dir)!r}: {str(existing)!r} is not writable")
    try:  # a real write: os.access says yes for root, and for /proc, where nothing can be created
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise UserError(f"output_dir {str(output_dir)!r}: {str(existing)!r} is not writable ({e.strerror})") from None


def clear(output_dir: Path) -> None:
    for name in RUN_OUTPUTS:
        path = output_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def claim(output_dir: Path, resume: bool | str, overwrite: bool, main_process: bool = True,
          say: Callable[[str], None] = print) -> Path | None:
    """Decide what this run does with `output_dir`; return the checkpoint to resume from, if any.
    Only the main process deletes files (the caller waits for it before going on)."""
    output_dir = Path(output_dir)
    check_writable(output_dir)
    if resume is not False and overwrite:
        raise UserError(f"resume={resume} and overwrite=true contradict each other; choose one")
    if resume is not False:
        found = ckpt.latest_checkpoint(output_dir, warn=say)
        if found is not None:
            say(f"resuming from {found}")
            return found
        if resume is True:
            damaged = " (every one is damaged)" if ckpt.published_checkpoints(output_dir) else ""
            raise UserError(f"resume=true but output_dir {str(output_dir)!r} has no checkpoint to resume "
                            f"from{damaged}; run with resume=auto to start when there is none")
        say(f"resume=auto: no checkpoint in {output_dir}, starting a new run")
        if main_process:
            clear(output_dir)  # what a run that never reached a checkpoint left behind
        return None
    found = run_files(output_dir)
    if found and not overwrite:
        raise UserError(f"output_dir {str(output_dir)!r} holds another run's files ({', '.join(found)}); "
                        "pass resume=true to continue that run, overwrite=true to replace it, "
                        "or choose another output_dir")
    if found and main_process:
        say(f"overwrite=true: clearing the previous run's files in {output_dir}")
        clear(output_dir)
    return None
