"""What an adapter sees of an FSDP2 run (`FullyShardedView`, the strategy's `ParallelView`): rollouts
in lockstep when they run on sharded parameters, a parameter gathered whole for code outside its
module's forward, the whole weights read one shard unit at a time (a vLLM engine's weight sync), and
the helpers that tell a shard from a whole tensor."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from mmrl.core.parallel import ParallelView


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This process's shard of a sharded tensor (DTensor); any other tensor as it is."""
    from torch.distributed.tensor import DTensor
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def unsharded_class(module: nn.Module) -> type:
    """The class `module` had before `fully_shard` (which gives it a subclass of FSDPModule)."""
    from torch.distributed.fsdp import FSDPModule
    return next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))


def is_sharded(model: nn.Module) -> bool:
    """Whether `fully_shard` was applied to `model` or one of its modules."""
    from torch.distributed.fsdp import FSDPModule
    return any(isinstance(m, FSDPModule) for m in model.modules())


def gathered_in_turn(model: nn.Module) -> Iterator[tuple[list[str], bool]]:
    """`model`'s parameters gathered one FSDP2 shard unit at a time, for a reader of the whole
    weights (a vLLM engine's weight sync): for each unit, in the order of its first parameter,
    the names of the parameters it holds (as ``named_parameters(remove_duplicate=False)`` names
    them, tied names included), yielded while that unit is gathered, so that its parameters are
    whole tensors (in the compute dtype), and whether it was gathered for this. A unit gathered
    here is freed when the caller asks for the next one (copy what you keep): besides the shards,
    one unit's parameters exist at a time, as in a forward. A unit that was already gathered
    (inside `Sharding.gathered`) is left as it is. Every process must go through all units in
    step (each gather is a collective). A model that is not sharded is one group of every name,
    not gathered here."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    owner: dict[str, nn.Module | None] = {}  # module path -> the shard unit that holds its own parameters
    for path, module in model.named_modules(remove_duplicate=False):
        parent = owner.get(path.rpartition(".")[0]) if path else None
        owner[path] = module if isinstance(module, FSDPModule) else parent
    groups: dict[int, tuple[nn.Module | None, list[str]]] = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        unit = owner[name.rpartition(".")[0]]
        groups.setdefault(id(unit), (unit, []))[1].append(name)
    for unit, names in groups.values():
        sharded = unit is not None and any(isinstance(model.get_parameter(n), DTensor) for n in names)
        if sharded:
            unit.unshard()
        try:
            yield names, sharded
        finally:
            if sharded:
                unit.reshard()


class FullyShardedView(ParallelView):
    """What an adapter sees of an FSDP2 run: rollouts in lockstep when they run on sharded
    parameters (`distributed.rollout_params: sharded`), weights readable one shard unit at a time.
    `offloaded`: the shards live on the CPU while the model computes on an accelerator."""

    def __init__(self, lockstep: bool, offloaded: bool = False):
        self.lockstep = lockstep
        self.description = "distributed.strategy=fsdp" + (" with distributed.rollout_params=sharded" if lockstep else "")
        if offloaded:
            self.whole_unavailable = "distributed.offload keeps the shards on the CPU"

    def is_sharded(self, model: nn.Module) -> bool:
        return is_sharded(model)

    def weights_in_turn(self, model: nn.Module) -> Iterator[tuple[list[str], bool]]:
        return gathered_in_turn(model)

    @contextmanager
    def whole(self, param: torch.Tensor) -> Iterator[torch.Tensor]:
        """A sharded parameter (its unit resharded after the forward) all-gathered; one that is not
        (its unit still gathered) as it is."""
        if self.is_whole(param):
            yield param
            return
        with torch.no_grad():
            gathered = param.full_tensor()
        yield gathered

    def whole_gradient(self, param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """Averaged over the processes and reduce-scattered into `param`'s shard, as FSDP reduces its
        units' gradients (a DTensor, which autograd accumulates into the shard's gradient)."""
        if self.is_whole(param):
            return grad
        from torch.distributed.tensor import DTensor, Partial
        return DTensor.from_local(grad, param.device_mesh, [Partial("avg")]).redistribute(
            param.device_mesh, param.placements)

    def is_whole(self, tensor: torch.Tensor) -> bool:
        from torch.distributed.tensor import DTensor
        return not isinstance(tensor, DTensor)

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        return local_tensor(tensor)

    def plain_class(self, module: nn.Module) -> type:
        return unsharded_class(module)

    def any_process(self, flag: bool) -> bool:
        if dist.get_world_size() == 1:
            return flag
        votes: list = [None] * dist.get_world_size()
        dist.all_gather_object(votes, flag)
        return any(votes)
