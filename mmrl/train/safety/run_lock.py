"""The lock a live run holds on its output directory, so that no second run writes into it.

``OUTPUT_DIR/run.lock`` is locked with ``fcntl.flock`` on a file kept open for the whole run and
records the holder (host, pid, start time). The kernel releases a flock when its process ends,
however it ends, so a lock whose process was killed is free again: the next run takes it over and
says whose it was. A run that ends normally empties the file. Only the main process of a
multi-process run takes the lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from mmrl.errors import UserError

LOCK_FILE = "run.lock"


def _holder(text: str) -> str:
    """'pid P on host H since T' from a lock file's record (the raw text if it is not one)."""
    try:
        record = json.loads(text)
        return f"pid {record['pid']} on host {record['host']} since {record['since']}"
    except (ValueError, KeyError, TypeError):
        return repr(text[:200])


class RunLock:
    """An exclusive lock on `output_dir`, held until `release` (or the process's end)."""

    def __init__(self, output_dir: str | Path, say: Callable[[str], None] = print):
        """Take the lock; a UserError naming the live holder if another process holds it."""
        self.path = Path(output_dir) / LOCK_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(os.pread(self._fd, 4096, 0).decode(errors="replace"))
            self._close()
            own = " (this Python process: another Trainer on this output_dir is still open)" \
                if f"pid {os.getpid()} on host {socket.gethostname()} " in holder else ""
            raise UserError(f"output_dir {str(output_dir)!r} is in use by a live run: {holder}{own}; wait for it "
                            "to end or stop it, or choose another output_dir") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            self._close()
            say(f"output_dir {output_dir}: this filesystem cannot lock files ({e.strerror}); nothing stops "
                "a second run from writing into it")
            return
        previous = os.pread(self._fd, 4096, 0).decode(errors="replace").strip()
        if previous:
            say(f"output_dir {output_dir}: taking over the lock of a run that ended without releasing it "
                f"({_holder(previous)}; that process no longer holds it)")
        record = {"host": socket.gethostname(), "pid": os.getpid(),
                  "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(record).encode(), 0)
        os.fsync(self._fd)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def release(self) -> None:
        """Empty the record and unlock (closing the file releases the flock); safe to call twice."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            self._close()

    def __del__(self) -> None:
        self.release()
