"""What an adapter may know of the run's distribution, handed to it once by the engine
(`Policy.use_parallel`); adapters never import `mmrl.distributed`.

The default view is one process with whole weights. A sharding strategy gives a view of its own
(in mmrl/distributed/), so that an adapter can generate in lockstep with the other
processes and read the whole weights one shard unit at a time (a vLLM engine's weight sync) without
knowing which strategy runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn


class ParallelView:
    """Whole weights, no collective in a forward."""

    lockstep: bool = False  # rollouts run on sharded parameters: every process runs as many forwards (synced_gpus)
    whole_unavailable: str | None = None  # why `whole` cannot gather a sharded parameter here (None: it can)
    # a module's parameters are whole only inside its own call (the strategy's hooks gather them for its
    # forward and backward, and reduce their gradients then): code that projects with a module's
    # parameters runs as that module's call
    gathers_in_module_calls: bool = False
    # the distribution in words (the strategy and its settings as the recipe names them), for a message
    # that must say which one runs: each strategy's view says its own, so an adapter names none
    description: str = "whole weights on every process"

    def is_sharded(self, model: nn.Module) -> bool:
        """Whether `model`'s parameters are split over the processes."""
        return False

    def weights_in_turn(self, model: nn.Module) -> Iterator[tuple[list[str], bool]]:
        """`model`'s parameters gathered group by group for a reader of the whole weights: for each
        group, the names of its parameters (as ``named_parameters(remove_duplicate=False)`` names them)
        while they are whole tensors, and whether they were gathered for this (copy what you keep: a
        gathered group is freed when the next is asked for). Every process must consume the iterator
        to the end, in step. Whole weights: one group of every name, not gathered."""
        yield [name for name, _ in model.named_parameters(remove_duplicate=False)], False

    @contextmanager
    def whole(self, param: Tensor) -> Iterator[Tensor]:
        """The parameter `param` as one whole tensor while the block runs, for code that uses it
        outside its module's forward (log-probs from the hidden states); where it is sharded, it is
        gathered from every process (each must enter the block, in step) and freed after."""
        yield param

    def whole_gradient(self, param: Tensor, grad: Tensor) -> Tensor:
        """This process's gradient `grad` of the whole `param` (as `whole` gave it), in the form its
        backward returns for `param`: where it is sharded, averaged over the processes into this
        process's shard, as the strategy reduces the gradients of its modules (every process must
        call it, in step)."""
        return grad

    def is_whole(self, tensor: Tensor) -> bool:
        """Whether `tensor` is the whole parameter (not this process's shard of it)."""
        return True

    def local(self, tensor: Tensor) -> Tensor:
        """This process's part of a parameter (the tensor itself when whole)."""
        return tensor

    def plain_class(self, module: nn.Module) -> type:
        """The class `module` was built with (sharding may give it a subclass)."""
        return type(module)

    def any_process(self, flag: bool) -> bool:
        """Whether `flag` holds on any process (every process must call it where models are sharded)."""
        return flag
