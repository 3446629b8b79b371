"""The allocation probe the benchmarks and tests share: the most bytes allocated at once while some
work runs, above what was allocated when it started. On a GPU, CUDA's allocator statistics
(`torch.cuda.max_memory_allocated`); on a CPU, the profiler's allocation events (each allocation
and free as it happens, summed in time order), which see every tensor the CPU allocator hands out.

`peak_bytes(fn)` probes one call; `MemoryProbe` probes a span (`start` ... `stop`, so a trainer's
own loop can be probed from its callbacks) and the phases inside it: methods wrapped with
`phase(obj, name, label)` report their own peak, and what was live when they started and ended."""

from __future__ import annotations

from typing import Any, Callable

import torch

PHASE_PREFIX = "probe:"  # the profiler ranges that mark a phase on a CPU


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Most bytes allocated at once while `fn` runs, beyond those allocated before it."""
    probe = MemoryProbe()
    probe.start()
    try:
        fn()
    finally:
        probe.stop()
    return probe.peak


def live_trace(events: list) -> list[tuple[int, int]]:
    """(time in ns, bytes live above the start) after each allocation event of a CPU profile."""
    live, trace = 0, []
    for at, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        live += nbytes
        trace.append((at, live))
    return trace


class MemoryProbe:
    """Peak bytes allocated above the start of a span, overall (`peak`) and per phase (`phases`:
    label -> {"peak": bytes, "start": bytes live at its first entry, "end": at its last exit}, the
    peak over every entry). Phases do not nest (CUDA keeps one peak statistic, reset at each phase)."""

    def __init__(self):
        self.cuda = torch.cuda.is_available()
        self.peak = 0
        self.phases: dict[str, dict[str, int]] = {}
        self._profile = None
        self._base = 0

    def phase(self, obj: Any, method: str, label: str) -> None:
        """Measure `obj.method`'s calls as the phase `label`."""
        inner = getattr(obj, method)

        def probed(*args, **kwargs):
            if self.cuda:
                return self._cuda_phase(label, inner, args, kwargs)
            with torch.profiler.record_function(PHASE_PREFIX + label):
                return inner(*args, **kwargs)

        setattr(obj, method, probed)

    def start(self) -> None:
        self.peak, self.phases = 0, {}
        if self.cuda:
            torch.cuda.synchronize()
            self._base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            return
        from torch.profiler import ProfilerActivity, profile
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()

    def stop(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = max(self.peak, torch.cuda.max_memory_allocated() - self._base)
            return
        self._profile.__exit__(None, None, None)
        events = list(self._profile.profiler.kineto_results.events())
        trace = live_trace(events)
        self.peak = max((live for _, live in trace), default=0)
        ranges = sorted((e.start_ns(), e.end_ns(), e.name()[len(PHASE_PREFIX):]) for e in events
                        if e.name().startswith(PHASE_PREFIX))
        for begin, end, label in ranges:
            inside = [live for at, live in trace if begin <= at <= end]
            before = [live for at, live in trace if at < begin]
            until = [live for at, live in trace if at <= end]
            self._record(label, max(inside, default=before[-1] if before else 0), before[-1] if before else 0,
                         until[-1] if until else 0)

    def _cuda_phase(self, label: str, inner, args, kwargs):
        torch.cuda.synchronize()
        self.peak = max(self.peak, torch.cuda.max_memory_allocated() - self._base)
        start = torch.cuda.memory_allocated() - self._base
        torch.cuda.reset_peak_memory_stats()
        try:
            return inner(*args, **kwargs)
        finally:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - self._base
            self.peak = max(self.peak, peak)
            self._record(label, peak, start, torch.cuda.memory_allocated() - self._base)

    def _record(self, label: str, peak: int, start: int, end: int) -> None:
        seen = self.phases.get(label)
        if seen is None:
            self.phases[label] = {"peak": peak, "start": start, "end": end}
        else:
            seen["peak"], seen["end"] = max(seen["peak"], peak), end

    def report(self) -> dict[str, Any]:
        """The span's peak and its phases', in MB."""
        mb = lambda n: round(n / 2**20, 3)  # noqa: E731
        return {"peak_mb": mb(self.peak),
                "phases": {k: {f"{key}_mb": mb(v) for key, v in p.items()} for k, p in self.phases.items()}}
