"""The `Strategy` interface: how a run places, shards, steps and saves the policy over its processes
(`distributed.strategy`, docs/distributed.md). The trainer calls only these methods; a new strategy
is one module with a subclass registered in `STRATEGIES` (`@STRATEGIES.register("name")`), checked by
the shared contract tests (tests/strategy_contract.py) under one and two processes.

A strategy is built from the recipe (`Strategy(cfg)`), then, in this order: `accelerator()`, `place`
(the policy built, before LoRA), `frozen` (the reference copy, if any), `shard` (the policy model,
before its optimizer is built), `prepare` (the model and its optimizer). During a step: `gathered`
around no-grad passes, `no_sync` and `backward` for each micro-batch, `gradients_finite`, then
`step` or `drop_gradients`. Checkpoints: `save` and `load`.

Defaults describe data parallelism (every process holds the whole model, gradients averaged), so a
strategy overrides only what it does differently.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from mmrl.config.sections import DistributedConfig, TrainConfig
from mmrl.core.parallel import ParallelView
from mmrl.core.policy import Policy
from mmrl.registry import Registry


@dataclass(frozen=True)
class StateShares:
    """What part of the whole training state one process keeps on its device between layers, for
    the memory plan (`mmrl plan`): shares of the weights, gradients and optimizer state (1: whole,
    1/N: sharded over N processes, 0: kept in CPU memory), and whether the weights and optimizer
    state stay fp32 whatever the policy's dtype (a master copy; the dtype is then the compute one)."""

    weights: float
    gradients: float
    optimizer: float
    fp32_master: bool = False


class Strategy:
    """Data parallelism through `accelerate` (the base of every strategy)."""

    frees_gradients = False  # an optimizer step frees the gradients (set to None) until the next backward

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.acc = None  # the run's Accelerator, set by `accelerator()`

    # ----- building ---------------------------------------------------------------------------
    @classmethod
    def config_problems(cls, cfg: TrainConfig) -> list[str]:
        """What in the recipe this strategy cannot run, one message per problem, before anything loads."""
        return []

    @classmethod
    def state_shares(cls, cfg: DistributedConfig, processes: int) -> StateShares:
        """What one of `processes` processes keeps on its device (`StateShares`): everything, here."""
        return StateShares(1.0, 1.0, 1.0)

    def accelerator(self, given=None):
        """The run's `Accelerator`: `given`, or a new one."""
        from accelerate import Accelerator
        self.acc = given or Accelerator()
        return self.acc

    def place(self, model: nn.Module) -> None:
        """Prepare the freshly built policy model (on its device, before LoRA) for this strategy."""

    def view(self) -> ParallelView:
        """What the adapter may know of the distribution (`Policy.use_parallel`)."""
        return ParallelView()

    def frozen(self, model: nn.Module) -> nn.Module:
        """The frozen reference copy as it is kept: whole on every process here."""
        return model

    def shard(self, model: nn.Module) -> None:
        """Split the policy model over the processes in place (before its optimizer is built)."""

    def allow_partial_backward(self) -> None:
        """Before `prepare`: a backward may leave some parameters without a gradient (`Policy.partial_backward`),
        which DistributedDataParallel then finds on each synchronised backward (find_unused_parameters)."""
        from accelerate.utils import DistributedDataParallelKwargs
        self.acc.ddp_handler = DistributedDataParallelKwargs(find_unused_parameters=True)

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The trained module and its optimizer, wrapped for the backend."""
        return self.acc.prepare(model, optimizer)

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The adapter's model inside the backend's wrapper."""
        return self.acc.unwrap_model(model)

    def parameter_counts(self, model: nn.Module) -> tuple[int, int]:
        """(trainable, total) whole parameter sizes of the adapter's model, however they are sharded."""
        params = list(self.unwrap(model).parameters())
        return (sum(self.numel(p) for p in params if p.requires_grad), sum(self.numel(p) for p in params))

    @staticmethod
    def numel(param: Tensor) -> int:
        """A parameter's whole size (FSDP's sharded parameters report the whole one)."""
        return param.numel()

    # ----- a step -----------------------------------------------------------------------------
    @property
    def lockstep(self) -> bool:
        """Every process runs as many forward and backward passes (sharded parameters are gathered
        by collectives inside them): a process without rows runs passes at zero."""
        return False

    @property
    def forwards_in_step(self) -> bool:
        """No-grad passes (log-probs, rollouts) need every process: they run on sharded parameters."""
        return False

    def gathered(self, model: nn.Module, always: bool = False) -> AbstractContextManager:
        """`model`'s whole parameters for no-grad passes whose count may differ between processes;
        `always`: even where the recipe asks for sharded passes. Nothing to do for whole models."""
        return nullcontext()

    def no_sync(self, model: nn.Module, last: bool) -> AbstractContextManager:
        """Around a micro-batch's forward and backward: data parallelism averages the gradients on
        the step's last backward only."""
        if last or self.acc.num_processes == 1:
            return nullcontext()
        return self.acc.no_sync(model)

    def backward(self, model: nn.Module, loss: Tensor, last: bool) -> None:
        """Backward of one micro-batch (`last`: the step's last one)."""
        self.acc.backward(loss)

    def gradients_finite(self, model: nn.Module, params: list[Tensor]) -> bool:
        """Whether this process's gradients are all finite (after the step's last backward)."""
        return all_finite(p.grad for p in params)

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, params: list[Tensor]) -> float:
        """Clip (`optim.max_grad_norm`), step the optimizer, clear the gradients; returns the gradient
        norm before clipping (0 when the recipe does not clip)."""
        zero_missing_gradients(params)
        norm = 0.0
        if self.cfg.optim.max_grad_norm is not None:
            norm = float(self.acc.clip_grad_norm_(params, self.cfg.optim.max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=self.frees_gradients)
        return norm

    def drop_gradients(self, model: nn.Module, optimizer: torch.optim.Optimizer, params: list[Tensor]) -> float:
        """Forget the step's gradients without stepping (a non-finite step is skipped); returns NaN,
        the gradient norm logged for a skipped step."""
        zero_missing_gradients(params)
        optimizer.zero_grad(set_to_none=False)
        return math.nan

    # ----- checkpoints ------------------------------------------------------------------------
    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, policy: Policy, directory: Path) -> None:
        """Write the optimizer, scheduler and RNG states (`Accelerator.save_state`, the weights with
        their tied copies left out as transformers leaves them out, `without_tied_copies`) and the whole
        weights as the adapter saves them (``model/``, the main process) into `directory`."""
        hook = self.acc.register_save_state_pre_hook(without_tied_copies)
        try:
            self.acc.save_state(str(directory), safe_serialization=True)
        finally:
            hook.remove()
        if self.acc.is_main_process:
            policy.save_pretrained(self.unwrap(model), directory / "model")

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        """Read back what `save` wrote."""
        self.acc.load_state(str(directory))


def without_tied_copies(models: list[nn.Module], weights: list[dict[str, Tensor]], directory: str) -> None:
    """Before `Accelerator.save_state` writes each model's weights: leave out the tied copies a
    transformers model declares (`_tied_weights_keys`, e.g. ``lm_head.weight`` of a model whose
    output head is its input embedding), with transformers' own `remove_tied_weights_from_state_dict`,
    as `save_pretrained` does; loading ties them again. (Otherwise accelerate drops them itself and
    prints "Removed shared tensor ..." at every checkpoint.) A model declaring none is left as it is."""
    from transformers.modeling_utils import remove_tied_weights_from_state_dict
    for model, state in zip(models, weights):
        if any(getattr(m, "_tied_weights_keys", None) for m in model.modules()):
            remove_tied_weights_from_state_dict(state, model)  # in place


def all_finite(tensors: Iterable[Tensor | None]) -> bool:
    """Whether every element of `tensors` (None ones skipped) is finite, in one pass and one device
    synchronisation: the total 2-norm over all of them, which a NaN or inf element makes non-finite
    (as does a norm beyond float range, which clipping could not use either)."""
    present = [t for t in tensors if t is not None]
    return not present or bool(torch.isfinite(torch.nn.utils.get_total_norm(present)))


def zero_missing_gradients(params: list[Tensor]) -> None:
    """A parameter with no gradient (unused by the step's forwards) still takes an optimizer step, at zero."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


STRATEGIES: Registry[type[Strategy]] = Registry("distribution strategy")


def sharded_shares(cfg: DistributedConfig, processes: int) -> StateShares:
    """The shares of a strategy that shards the weights, gradients and AdamW state over the processes
    with an fp32 master copy: 1/N of each on the device, none with `distributed.offload`."""
    share = 0.0 if cfg.offload else 1.0 / processes
    return StateShares(share, share, share, fp32_master=True)
