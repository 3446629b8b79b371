"""One run per output directory.

A new run refuses a directory that holds another run's files (naming them); ``overwrite=true``
clears those files once the new run's data and model loaded (`settle`). ``resume=true`` continues
the run from its newest good checkpoint (an error when there is none); ``resume=auto`` continues if
there is a checkpoint and starts a new run otherwise, saying which. A resume whose settings differ
from the saved run's ``config.json`` is refused, listing them, unless ``resume_changes=allow``.
Everything but `settle` runs before any model, data set or reward model loads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl.config.parse import ConfigError, parse_config, to_dict
from mmrl.config.sections import TrainConfig
from mmrl.distributed.gather import gather_objects
from mmrl.errors import UserError
from mmrl.train.safety import checkpoint as ckpt
from mmrl.train.safety.run_lock import RunLock

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


@dataclass
class Claim:
    """What this run does with its output directory: the checkpoint it resumes from, whether the
    previous run's files are cleared (after the model loaded), the settings it changes on resume."""

    resume_from: Path | None = None
    clear: bool = False
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)


def claim(output_dir: Path, resume: bool | str, overwrite: bool, recipe: dict | None = None,
          resume_changes: str = "refuse", say: Callable[[str], None] = print) -> Claim:
    """Decide what this run does with `output_dir` (deleting nothing: `settle` does, once the run's
    model loaded); refuse a resume whose `recipe` changes the saved run's settings (`resume_changes`)."""
    output_dir = Path(output_dir)
    check_writable(output_dir)
    if resume is not False and overwrite:
        raise UserError(f"resume={resume} and overwrite=true contradict each other; choose one")
    if resume is not False:
        found = ckpt.latest_checkpoint(output_dir, warn=say)
        if found is not None:
            changes = resume_config_changes(output_dir, recipe, resume_changes) if recipe is not None else {}
            say(f"resuming from {found}")
            return Claim(found, changes=changes)
        if resume is True:
            damaged = " (every one is damaged)" if ckpt.published_checkpoints(output_dir) else ""
            raise UserError(f"resume=true but output_dir {str(output_dir)!r} has no checkpoint to resume "
                            f"from{damaged}; run with resume=auto to start when there is none")
        say(f"resume=auto: no checkpoint in {output_dir}, starting a new run")
        return Claim(clear=True)  # what a run that never reached a checkpoint left behind
    found = run_files(output_dir)
    if found and not overwrite:
        raise UserError(f"output_dir {str(output_dir)!r} holds another run's files ({', '.join(found)}); "
                        "pass resume=true to continue that run, overwrite=true to replace it, "
                        "or choose another output_dir")
    return Claim(clear=bool(found))


def claim_for_run(accelerator, cfg: TrainConfig, recipe: dict) -> tuple[Claim, RunLock | None]:
    """The main process locks `cfg.output_dir` (`RunLock`) and decides (`claim`, `recipe` the whole
    resolved recipe); every process gets the decision or the error, the main process the lock too."""
    lock, outcome = None, None
    if accelerator.is_main_process:
        try:
            check_writable(Path(cfg.output_dir))
            lock = RunLock(cfg.output_dir)
            outcome = claim(Path(cfg.output_dir), cfg.resume, cfg.overwrite, recipe, cfg.resume_changes)
        except UserError as e:
            outcome = e
    outcome = gather_objects(accelerator, outcome)[0]
    if isinstance(outcome, UserError):
        if lock is not None:
            lock.release()
        raise outcome
    return outcome, lock


def settle(output_dir: Path, claimed: Claim, say: Callable[[str], None] = print) -> None:
    """Carry out `claimed` once the run's data and model loaded (the main process only): clear the
    previous run's files, or record the settings a resumed run changed beside its config.json."""
    output_dir = Path(output_dir)
    if claimed.clear and any((output_dir / name).exists() for name in RUN_OUTPUTS):
        say(f"clearing the previous run's files in {output_dir}")
        clear(output_dir)
    if claimed.changes and claimed.resume_from is not None:
        record = output_dir / f"config.resume-{claimed.resume_from.name}.json"
        record.write_text(json.dumps({"resumed_from": str(claimed.resume_from),
                                      "changes": {k: {"old": old, "new": new}
                                                  for k, (old, new) in claimed.changes.items()}}, indent=1))
        say(f"resume_changes=allow: the changed settings are recorded in {record}")


# ----- a resumed run's settings against the saved run's -----------------------------------------------
# Settings a resumed run may change freely: how far it goes, where the directory now is, how often it
# saves, what it logs. Every other difference from the saved config.json is a change of the run.
FREE_ON_RESUME = ("resume", "resume_changes", "overwrite", "max_steps", "output_dir", "save_every",
                  "save_total_limit", "logging")
# Settings a checkpoint cannot be loaded without: refused even with resume_changes=allow.
FIXED_ON_RESUME = ("task", "policy.model")


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested settings as {dotted key: value} (a list, or an empty section, is one value)."""
    out: dict[str, Any] = {}
    for name, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


# Where a served reward's answers come from (rewards.NAME.url, ...): a resumed run may move its server.
FREE_REWARD_KEYS = ("url", "client", "server", "record", "replay")


def _served_setting(key: str) -> bool:
    """Whether `key` is under a reward's url, client, server, record or replay (a reward's name may hold dots)."""
    parts = key.split(".")
    for part in parts[2:] if parts[0] == "rewards" else []:
        if part in ("weight", "args", "columns"):
            return False
        if part in FREE_REWARD_KEYS:
            return True
    return False


def _free(key: str) -> bool:
    return _served_setting(key) or any(key == name or key.startswith(name + ".") for name in FREE_ON_RESUME)


def _as_read_now(saved: dict) -> dict:
    """The saved run's settings as this version of mmrl reads them: a setting added since the run was
    saved takes its default there, so resuming with that default is no change. A saved recipe this
    version no longer parses (a setting removed since) is compared as it was written."""
    try:
        return to_dict(parse_config(saved))
    except ConfigError:
        return saved


def resume_config_changes(output_dir: Path, recipe: dict, resume_changes: str) -> dict[str, tuple[Any, Any]]:
    """The settings `recipe` changes from the run saved in `output_dir`/config.json, as (old, new) by
    dotted key; a UserError listing them unless `resume_changes` is ``allow`` (never for `FIXED_ON_RESUME`)."""
    saved_path = output_dir / "config.json"
    if not saved_path.is_file():
        return {}
    try:
        saved = _flat(_as_read_now(json.loads(saved_path.read_text())))
    except ValueError as e:
        raise UserError(f"{saved_path} is not readable JSON ({e}); resume needs the saved run's settings") from None
    new = _flat(_as_read_now(json.loads(json.dumps(recipe, default=str))))
    absent = "(absent)"
    changes = {k: (saved.get(k, absent), new.get(k, absent)) for k in sorted({*saved, *new})
               if saved.get(k, absent) != new.get(k, absent) and not _free(k)}
    fixed = [k for k in changes if any(k == f or k.startswith(f + ".") for f in FIXED_ON_RESUME)]
    listed = "; ".join(f"{k}: {json.dumps(old, default=str)} -> {json.dumps(v, default=str)}"
                       for k, (old, v) in changes.items() if k in fixed or not fixed)
    if fixed:
        raise UserError(f"resume: the checkpoints in {str(output_dir)!r} are of another model ({listed}); "
                        "resume with the run's own task and policy.model, or start a new run in another output_dir")
    if changes and resume_changes != "allow":
        raise UserError(f"resume: this recipe changes the settings of the run in {str(output_dir)!r} ({listed}); "
                        "resume with the saved settings (its config.json), or pass resume_changes=allow to "
                        "continue with the new ones (recorded beside config.json)")
    return changes
