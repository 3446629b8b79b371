"""What an adapter tells the memory plan (`mmrl plan`, mmrl/experiments/memory_plan.py) about its
model: the model built without weights (meta parameters of the real build's shapes and dtypes) and
the bytes of the passes a training step runs, by component, computed from its configuration alone.

The engine adds the training state (weights, gradients, AdamW state, shared as the strategy shares
them) and finds the largest group size and micro-batch that fit, and the largest of each input size
the formula offers (`SizeAxis`: a resolution, a frame count); an adapter returns a `MemoryModel`
from `Policy.memory_model`, whose formula is its family's own (layers, heads, vocabulary, ...)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from torch import nn


@dataclass(frozen=True)
class SizeAxis:
    """An input size the plan searches under `--gpu-memory` beside the group size and micro-batch
    (an image's resolution, a video's frames): its allowed values are steps 1 .. `most`, and
    `at(step)` is the recipe's settings there (a field's name -> its value) with the formula there."""

    most: int                                                        # the largest step searched
    at: Callable[[int], tuple[dict[str, int], "MemoryModel"]]        # step -> (settings, formula)


class MemoryModel(ABC):
    """A family's memory formula for one recipe's policy (`Policy.memory_model`)."""

    family: str = ""  # what the formula describes, as the plan prints it (e.g. "decoder-only transformer")

    def __init__(self, module: nn.Module, checkpointing: bool):
        self.module = module  # the weightless build: meta parameters, the real build's shapes and dtypes
        self.checkpointing = checkpointing  # the recipe trains with activation (gradient) checkpointing

    def frozen_bytes(self) -> dict[str, int]:
        """Bytes by component of the frozen modules the run holds beside `module` (the trained one):
        a pipeline's encoders and decoder, say, kept whole by every process. None here."""
        return {}

    def size_axes(self) -> dict[str, SizeAxis]:
        """The input sizes the plan searches for the largest that fits (a name, as the plan prints
        it -> its axis), each at the recipe's other sizes. None here."""
        return {}

    def host_bytes(self, rows: int, micro_batch: int) -> dict[str, int]:
        """Bytes by component a step's `rows` rollouts keep in host (CPU) memory from their rollout
        to the update, not on the device (a diffusion trajectory's states, say), with the copy the
        update selects of a micro-batch's `micro_batch` rows. None here."""
        return {}

    @abstractmethod
    def activation_bytes(self, rows: int, checkpointing: bool) -> int:
        """The activations one training forward of `rows` rollouts keeps for its backward (with or
        without activation checkpointing), in bytes."""

    @abstractmethod
    def update_bytes(self, rows: int, prompts: int, trains_head: bool) -> dict[str, int]:
        """Bytes by component (name -> bytes) at the peak of one training forward and backward of
        `rows` rollouts, beyond the training state (the activations with the recipe's checkpointing
        among them where the peak holds them; `prompts`: the step's prompts on this process, whose
        inputs the step's batch holds beside the pass, a group's rows sharing their prompt's;
        `trains_head`: the output layer takes a gradient)."""

    def first_step_bytes(self, rows: int, prompts: int) -> dict[str, int]:
        """Bytes by component of a pass the first training step of a run (or of a resumed run) adds
        to one micro-batch of `rows` rollouts (`prompts` as `update_bytes` takes it), beyond the
        training state: a check of the fused path against a plainer one, say. None here."""
        return {}

    @abstractmethod
    def rollout_bytes(self, rows: int, group_size: int) -> dict[str, int]:
        """Bytes by component of one generation call of `rows` rollouts, groups of `group_size` (its
        cache, its sampler)."""
