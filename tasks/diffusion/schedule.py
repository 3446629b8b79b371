"""Which denoising steps are stochastic and which are trained: one schedule object.

    all_but_last     SDE on every step, every step trained but the last (sigma -> 0; Flow-GRPO)
    random_fraction  SDE on every step, a random `fraction` of steps 0..U-2 trained per rollout
                     (DanceGRPO: 60%)
    window           SDE inside steps [start, start + size), ODE outside, the window trained
    random_window    as `window`, the start drawn per group uniformly from window_range[0] ..
                     window_range[1] - size (Flow-GRPO-Fast: size 2-3 in [0, U // 2))
    sliding_window   as `window`, the start moving by `stride` every `shift_every` training steps
                     (MixGRPO); `end` says what happens at the end of a sweep (below)
    chunks           SDE on every step; the steps are cut into consecutive chunks of `sizes`, and
                     `sample` chunks are trained per rollout, drawn with probability proportional
                     to `weights` (Chunk-GRPO's weighted chunk sampling; all chunks when sample = 0);
                     the last step is never trained

MixGRPO's sliding window (Tencent-Hunyuan/MixGRPO, `GRPOTrainingStates` with `--roll_back`, as in
its published scripts): training iteration j = 0, 1, ... (the trainer's step k is iteration
k - 1) uses the window position p = start + stride * n, n = (j // shift_every) mod N, and
``end`` picks the sweep's end:

    shrink  (default, the authors' code) positions p = start, start + stride, ... up to U - 2;
            the window is [p, min(p + size, U - 2)): it shrinks over the last positions, step
            U - 2 is never trained, and at p = U - 2 the window is empty (an all-ODE rollout
            with nothing trained) before rolling back to `start`
    wrap    (mmrl's earlier rule) full windows only: p runs over start, start + stride, ...
            modulo the U - size positions that leave the last step out
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

KINDS = ("all_but_last", "random_fraction", "window", "random_window", "sliding_window", "chunks")
WINDOW_ENDS = ("shrink", "wrap")


@dataclass
class StepSchedule:
    kind: str = field(default="all_but_last", metadata={"help": (
        "all_but_last (Flow-GRPO), random_fraction (DanceGRPO), window (a fixed SDE window), random_window "
        "(Flow-GRPO-Fast), sliding_window "
        "(MixGRPO), chunks (Chunk-GRPO); see docs/methods.md."), "choices": "mmrl.tasks.diffusion.schedule:KINDS"})
    fraction: float = field(default=0.6, metadata={"help": (
        "random_fraction: the share of steps trained per rollout (DanceGRPO 0.6), in (0, 1].")})
    start: int = field(default=0, metadata={"help": "window / sliding_window: the first step of the SDE window."})
    size: int = field(default=2, metadata={"help": (
        "window / random_window / sliding_window: steps in the window (MixGRPO 4; Flow-GRPO-Fast 2, 3 without CFG).")})
    window_range: list[int] = field(default_factory=list, metadata={"help": (
        "random_window: [first, stop) the window is drawn inside, its start uniform in first .. stop - size, one "
        "draw per group (empty: [0, num_steps // 2], Flow-GRPO-Fast's sde_window_range).")})
    stride: int = field(default=1, metadata={"help": "sliding_window: steps the window moves each shift."})
    shift_every: int = field(default=25, metadata={"help": (
        "sliding_window: training steps between shifts (MixGRPO 20-25).")})
    sizes: list[int] = field(default_factory=list, metadata={"help": (
        "chunks: lengths of the consecutive chunks of steps, summing to num_steps (Chunk-GRPO [2, 3, 4, 7] for "
        "16).")})
    sample: int = field(default=0, metadata={"help": (
        "chunks: chunks trained per rollout, drawn with probability proportional to weights (0: every chunk).")})
    weights: list[float] = field(default_factory=list, metadata={"help": (
        "chunks: sampling weight of each chunk (empty: equal), e.g. biased to high noise.")})
    end: Literal["shrink", "wrap"] = field(default="shrink", metadata={"help": (
        "sliding_window at the end of a sweep: shrink = MixGRPO's code (the window is cut at step U - 2, "
        "then one position with an empty window, then back to `start`); wrap = full windows only, "
        "the start wrapping modulo U - size (mmrl's earlier rule)")})

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"policy.schedule.kind={self.kind!r} is not one of {', '.join(KINDS)}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"policy.schedule.fraction={self.fraction} must be in (0, 1]")
        if self.kind == "chunks" and not self.sizes:
            raise ValueError("policy.schedule.kind='chunks' needs policy.schedule.sizes (chunk lengths in steps)")
        if self.weights and len(self.weights) != len(self.sizes):
            raise ValueError(f"policy.schedule.weights={self.weights} must give one weight per chunk {self.sizes}")
        if self.end not in WINDOW_ENDS:
            raise ValueError(f"policy.schedule.end={self.end!r} is not one of {', '.join(WINDOW_ENDS)}")
        if self.window_range and (len(self.window_range) != 2 or not 0 <= self.window_range[0] < self.window_range[1]):
            raise ValueError(f"policy.schedule.window_range={self.window_range} must be [first, stop) with "
                             "0 <= first < stop")
        if self.kind == "sliding_window" and (self.stride < 1 or self.shift_every < 1):
            raise ValueError(f"policy.schedule.stride={self.stride} and shift_every={self.shift_every} must be >= 1")

    def window(self, num_steps: int, training_step: int) -> tuple[int, int]:
        """[first, stop) of the SDE window at the trainer's `training_step` (counted from 1)."""
        if self.kind == "window":
            return self.start, self.start + self.size
        shifts = max(training_step - 1, 0) // self.shift_every  # MixGRPO counts iterations from 0
        if self.end == "wrap":
            span = max(num_steps - self.size, 1)  # window positions that leave the last step out
            first = (self.start + self.stride * shifts) % span
            return first, first + self.size
        last = num_steps - 2  # MixGRPO's max_timesteps = sampling_steps - 2
        if not 0 <= self.start <= last:
            raise ValueError(f"policy.schedule.start={self.start} must be in [0, {last}] for {num_steps} steps")
        first = self.start + self.stride * (shifts % ((last - self.start) // self.stride + 1))
        return first, min(first + self.size, last)

    def random_window(self, num_steps: int, generator: torch.Generator) -> tuple[int, int]:
        """[first, stop) of a random_window draw: first uniform in range[0] .. range[1] - size."""
        low, high = self.window_range or [0, num_steps // 2]
        if high > num_steps or self.size < 1 or high - low < self.size:
            raise ValueError(f"policy.schedule.window_range={[low, high]} must hold a window of size {self.size} "
                             f"within the {num_steps} steps")
        first = int(torch.randint(low, high - self.size + 1, (1,), generator=generator))
        return first, first + self.size

    def stochastic(self, num_steps: int, training_step: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """bool [U]: the steps that sample by SDE (the others are ODE steps); random_window draws its
        window from `generator` (the group's)."""
        out = torch.ones(num_steps, dtype=torch.bool)
        if self.kind in ("window", "random_window", "sliding_window"):
            first, stop = (self.random_window(num_steps, generator) if self.kind == "random_window"
                           else self.window(num_steps, training_step))
            if stop > num_steps:
                raise ValueError(f"policy.schedule window [{first}, {stop}) does not fit {num_steps} steps")
            out[:] = False
            out[first:stop] = True
        return out

    def trained(self, num_steps: int, training_step: int, generator: torch.Generator) -> torch.Tensor:
        """bool [U] for one rollout (random kinds draw from `generator`); never the last step.
        random_window: every step, the rollout keeping those its group sampled by SDE."""
        u = num_steps
        if self.kind in ("all_but_last", "random_window"):
            out = torch.ones(u, dtype=torch.bool)
        elif self.kind == "random_fraction":
            k = max(1, round(self.fraction * (u - 1)))
            out = torch.zeros(u, dtype=torch.bool)
            out[torch.randperm(u - 1, generator=generator)[:k]] = True
        elif self.kind in ("window", "sliding_window"):
            out = self.stochastic(u, training_step)
        else:
            if sum(self.sizes) != u:
                raise ValueError(f"policy.schedule.sizes={self.sizes} must sum to the {u} steps (policy.num_steps)")
            out = torch.zeros(u, dtype=torch.bool)
            starts = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
            picked = range(len(self.sizes))
            if self.sample:
                w = torch.tensor(self.weights or [1.0] * len(self.sizes), dtype=torch.float64)
                picked = torch.multinomial(w, min(self.sample, len(self.sizes)), generator=generator).tolist()
            for c in picked:
                out[starts[c]:starts[c] + self.sizes[c]] = True
        out[u - 1] = False
        return out
