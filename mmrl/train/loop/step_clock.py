"""Where a training step's time goes: wall time per phase, logged as `time_<phase>_s` beside the
step's whole `time_step_s`.

Phases: `generate` (the policy's rollouts), `reward` (the reward functions, turning-point passes
included), `forward` (every log-prob pass: the training forward with its loss, the old and
reference passes), `backward`, `optimizer` (clipping, the optimizer step, clearing the gradients),
and `other`, the step's time outside them: drawing prompts, gathering across processes,
advantages, batching and the engine's bookkeeping. On a GPU each phase ends with a device
synchronisation, so its kernels are counted in it and not in the next phase.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

PHASES = ("generate", "reward", "forward", "backward", "optimizer")


class StepClock:
    """Wall time per phase of the current step (`start` ... `stop`); phases do not nest."""

    def __init__(self, synchronize: Callable[[], None] | None = None):
        self.synchronize = synchronize  # the device's synchronisation (CUDA), or None on CPU
        self.spent = dict.fromkeys(PHASES, 0.0)
        self.started = time.perf_counter()

    def start(self) -> None:
        """Begin a step: every phase at zero."""
        self.spent = dict.fromkeys(PHASES, 0.0)
        self.started = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the block's wall time (to the device's end of its work) towards phase `name`."""
        begun = time.perf_counter()
        try:
            yield
        finally:
            if self.synchronize is not None:
                self.synchronize()
            self.spent[name] += time.perf_counter() - begun

    def stop(self) -> dict[str, float]:
        """The step's metrics: `time_step_s`, `time_<phase>_s` for each phase, `time_other_s`."""
        total = time.perf_counter() - self.started
        return {"time_step_s": total, **{f"time_{p}_s": t for p, t in self.spent.items()},
                "time_other_s": total - sum(self.spent.values())}
