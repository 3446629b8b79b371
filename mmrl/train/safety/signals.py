"""SIGINT / SIGTERM during training: finish the current optimizer step, checkpoint, stop.

Schedulers send SIGTERM before they preempt a job; Ctrl-C sends SIGINT. The first signal sets a
flag that the training loop reads after each step (every process agrees before saving); a second
one exits at once, without saving.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from mmrl.errors import UserError

HANDLED = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(UserError):
    """The run stopped on a signal after writing a checkpoint; the message says how to resume."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopSignals:
    """Context manager: while active, SIGINT/SIGTERM set `received` (the signal's number)."""

    def __init__(self, say=None):
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._say = say or (lambda message: print(message, file=sys.stderr, flush=True))

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            self._say(f"mmrl: second {signal.Signals(signum).name}: exiting now without saving")
            os._exit(128 + signum)
        self.received = signum
        self._say(f"mmrl: {signal.Signals(signum).name} received: finishing the current step, then saving "
                  "a checkpoint (send it again to exit at once)")

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
