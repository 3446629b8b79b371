"""What the memory plan (`mmrl plan`, mmrl/experiments/memory_plan.py) asks of an adapter: a
`MemoryWorkload`, the adapter's own code ready to run on a policy whose modules are on the meta
device (built from the model's configuration, no weights), at the sizes of a `StepShape`.

The plan runs each callable under its tracer, which counts the bytes the tensors would take
without computing anything: the rollout's work and the record it keeps, the decoding of the
completions where the rollout record leaves it out, and (the engine's part) the log-prob passes of
a training micro-batch over that record, through `Policy.logprobs`, with and without gradient
checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from mmrl.core.rollout import Rollout


@dataclass
class StepShape:
    """One generation call the plan traces, as the recipe and the process count make it: its prompt
    rows (the data set's longest prompts, standing for the call's groups) and the group size."""

    prompts: list[Any]             # one data-set row per group of the call
    group_size: int                # rollouts per prompt

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.group_size


@dataclass
class MemoryWorkload:
    """An adapter's step on the meta device (module docstring); every callable is the adapter's own
    code, and what it allocates on the meta device is what the plan counts."""

    policy: Any                                   # the adapter (a Policy), its modules on the meta device
    held: dict[str, nn.Module]                    # every module it holds, by name (the trained one among them)
    rollout: Callable[[StepShape], Rollout]       # one generation call under no grad: its work; returns its record
    # bytes a generation call holds at its end beyond what `rollout` traced (a KV cache grown from the
    # prompt to the whole completion, one token at a time), for a call of the shape's rows
    rollout_growth: Callable[[StepShape], int] = lambda shape: 0
    decode: Callable[[StepShape], Any] | None = None  # the completions decoded (a VAE), where `rollout` skips it
    checkpointing: Callable[[bool], None] = lambda on: None  # the trained module's gradient checkpointing
    engine_share: float = 0.0  # of the device's memory a rollout engine of the adapter's reserves (vLLM's)
    notes: list[str] = field(default_factory=list)  # what this adapter's workload leaves out, for the report
