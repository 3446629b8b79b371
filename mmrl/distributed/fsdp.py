"""Sharded training with PyTorch's FSDP2 (`distributed.strategy: fsdp`, docs/distributed.md).

`Sharding` applies ``fully_shard`` to a module: each shard unit (a decoder layer, a vision block,
a DiT block; `distributed.shard_modules`) and then the root, so that between layers every process
holds 1/N of each parameter, its gradient and its AdamW state (fp32), and a unit's parameters are
all-gathered for its forward and backward only. Gradients are reduce-scattered (averaged) as
each unit's backward finishes.

Rollouts run on gathered parameters (`Sharding.gathered`): every unit is all-gathered once, the
adapter samples with no collective communication (each process may generate as many tokens as
its own prompts need), and the shards are freed afterwards. That costs one whole copy of the
weights in the compute dtype per process during the rollout, as a vLLM engine or an unsharded
model would, and is as fast as an unsharded model; per-layer gathering during generation would
all-gather the whole model once per generated token. A vLLM rollout engine holds its own copy
instead: its weight sync reads the policy one gathered unit at a time (`fsdp_view.gathered_in_turn`).

Checkpoints: each process writes its own shards with `torch.distributed.checkpoint`
(`save` / `load`), and the full weights for ``model/`` are gathered to the main process
(`full_state_dict`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from mmrl.config.rollouts import served_engine
from mmrl.config.sections import DistributedConfig, TrainConfig
from mmrl.core.parallel import ParallelView
from mmrl.core.policy import Policy
from mmrl.core.regularisers import regulariser_needs
from mmrl.distributed.fsdp_view import FullyShardedView, local_tensor, unsharded_class
from mmrl.distributed.strategy import STRATEGIES, StateShares, Strategy, all_finite, sharded_shares
from mmrl.errors import UserError

SHARDS_DIR = "sharded"  # a checkpoint's subdirectory with every process's shards (torch.distributed.checkpoint)


def block_classes(model: nn.Module) -> list[str]:
    """The model's own shard-unit class names: transformers' and diffusers' `_no_split_modules`,
    from every sub-model that declares them (a VLM's language model and vision tower)."""
    names: list[str] = []
    for module in model.modules():
        for name in getattr(module, "_no_split_modules", None) or []:
            if name not in names:
                names.append(name)
    return names


class Sharding:
    """FSDP2 over all processes of the default process group, on `device`'s type."""

    def __init__(self, cfg: DistributedConfig, device: torch.device, compute_dtype: torch.dtype):
        if not dist.is_available() or not dist.is_initialized():
            raise UserError("distributed.strategy=fsdp needs processes started by torchrun or accelerate launch "
                            "(e.g. `torchrun --nproc_per_node 2 -m mmrl train RECIPE distributed.strategy=fsdp`)")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
        self.cfg = cfg
        self.compute_dtype = compute_dtype
        self.mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        # fp32 weights, gradients and optimizer state; forward and backward in the compute dtype;
        # gradients reduced in fp32
        self.mixed_precision = MixedPrecisionPolicy(
            param_dtype=None if compute_dtype == torch.float32 else compute_dtype, reduce_dtype=torch.float32)
        self.offload = CPUOffloadPolicy() if cfg.offload else OffloadPolicy()

    def shard(self, model: nn.Module, what: str = "the policy") -> nn.Module:
        """`fully_shard` each shard unit of `model`, then the root (in place); returns `model`."""
        from torch.distributed.fsdp import fully_shard
        names = self.cfg.shard_modules if self.cfg.shard_modules is not None else block_classes(model)
        units = [m for m in model.modules() if type(m).__name__ in set(names)]
        if not units:
            found = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.ModuleList)
                            for m in m.children()})
            source = ("distributed.shard_modules=" + repr(names) if self.cfg.shard_modules is not None
                      else "the model's _no_split_modules " + repr(names))
            raise UserError(f"distributed.strategy=fsdp: {what} has no module of the classes of {source}; "
                            f"name its block classes in distributed.shard_modules (its repeated blocks: "
                            f"{', '.join(found) or 'none found'})")
        options = dict(mesh=self.mesh, mp_policy=self.mixed_precision, offload_policy=self.offload,
                       reshard_after_forward=self.cfg.reshard_after_forward)
        for unit in reversed(units):  # nested units (an attention inside an encoder layer) before their parents
            fully_shard(unit, **options)
        fully_shard(model, **options)
        # the root's state set up now, as its first forward would: a rollout may call a part of the model
        # (a composite's thinker) before any forward of the whole, which would make that part a root
        model._get_fsdp_state()._lazy_init()
        return model

    @contextmanager
    def gathered(self, model: nn.Module) -> Iterator[None]:
        """All of `model`'s parameters gathered (in the compute dtype) for the duration: forward
        passes inside need no communication, so each process may run as many as it likes."""
        from torch.distributed.fsdp import FSDPModule
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.unshard()
            unit.set_reshard_after_forward(False, recurse=False)
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(self.cfg.reshard_after_forward, recurse=False)

    @staticmethod
    def full_state_dict(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The whole weights in `dtype` (floating ones; the compute dtype, as an unsharded run in
        that dtype saves them), gathered on the CPU of the main process (an empty dict on the
        others); every process must call it. Tied parameters (an LM head sharing the embedding)
        are one tensor under each of their names, as in an unsharded state dict, so that
        `save_pretrained` writes them once."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        full = {k: v.to(dtype) if v.is_floating_point() else v for k, v in full.items()}
        first: dict[int, str] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            if name in full and first.setdefault(id(param), name) != name:
                full[name] = full[first[id(param)]]
        return full

    @staticmethod
    @contextmanager
    def plain_classes(model: nn.Module) -> Iterator[None]:
        """`model` and its shard units with the classes they had before sharding, for code that
        looks a model up by its class name (transformers' `save_pretrained` reverting its weight
        renamings); their state dicts still hold shards (see `full_state_dict`)."""
        from torch.distributed.fsdp import FSDPModule
        swapped = [(m, type(m)) for m in model.modules() if isinstance(m, FSDPModule)]
        for module, _ in swapped:
            module.__class__ = unsharded_class(module)
        try:
            yield
        finally:
            for module, cls in swapped:
                module.__class__ = cls

    @staticmethod
    def save(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        """Every process writes its shards of the weights and AdamW state under `directory`."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        weights, optim = get_state_dict(model, optimizer)
        dcp.save({"model": weights, "optimizer": optim}, checkpoint_id=str(directory))

    @staticmethod
    def load(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        """Read back what `save` wrote (the same number of processes and shard units)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        weights, optim = get_state_dict(model, optimizer)
        state = {"model": weights, "optimizer": optim}
        dcp.load(state, checkpoint_id=str(directory))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


@STRATEGIES.register("fsdp")
class FullySharded(Strategy):
    """FSDP2: parameters, gradients and AdamW state sharded over the processes (`Sharding`)."""

    sharding: Sharding
    frees_gradients = True  # the gradient shards, until the next backward (rollouts need none)

    @classmethod
    def state_shares(cls, cfg: DistributedConfig, processes: int) -> StateShares:
        return sharded_shares(cfg, processes)

    @classmethod
    def config_problems(cls, cfg: TrainConfig) -> list[str]:
        problems = []
        if cfg.warm_start.steps > 0 and regulariser_needs(cfg.algorithm, "reference"):
            problems.append(f"warm_start.steps={cfg.warm_start.steps} with a KL (algorithm.beta={cfg.algorithm.beta}) "
                            "and distributed.strategy=fsdp: the warm-started reference would be sharded, and checkpoints "
                            "keep it whole; warm-start with ddp or on one process, then train from that checkpoint's "
                            "model/ (or set warm_start.steps=0 or algorithm.beta=0)")
        if served_engine(cfg.policy):
            problems.append(f"policy.rollout_engine={cfg.policy['rollout_engine']} with distributed.strategy=fsdp: the "
                            "rollout servers are pushed the whole weights from the main process, which holds a shard; "
                            "use distributed.strategy=ddp")
        return problems

    def place(self, model: nn.Module) -> None:
        # the adapter's dtype becomes the compute dtype; weights and AdamW state stay fp32
        compute = next(p.dtype for p in model.parameters() if p.is_floating_point())
        self.sharding = Sharding(self.cfg.distributed, self.acc.device, compute)
        model.float()

    def view(self) -> ParallelView:
        return FullyShardedView(lockstep=self.forwards_in_step,
                                offloaded=self.cfg.distributed.offload and self.acc.device.type != "cpu")

    def frozen(self, model: nn.Module) -> nn.Module:
        return self.sharding.shard(model, "the reference model")  # a frozen sharded copy, never a whole replica

    def shard(self, model: nn.Module) -> None:
        self.sharding.shard(model)

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, optimizer  # sharded in place: the module is the model; checkpoints hold its shards (`save`)

    @property
    def lockstep(self) -> bool:
        return True

    @property
    def forwards_in_step(self) -> bool:
        return self.cfg.distributed.rollout_params == "sharded"

    def gathered(self, model: nn.Module, always: bool = False) -> AbstractContextManager:
        if not (always or self.cfg.distributed.rollout_params == "gathered"):
            return nullcontext()
        return self.sharding.gathered(model)

    def no_sync(self, model: nn.Module, last: bool) -> AbstractContextManager:
        return nullcontext()  # each backward reduce-scatters its gradients into the shards

    def gradients_finite(self, model: nn.Module, params: list[torch.Tensor]) -> bool:
        return all_finite(local_tensor(p.grad) for p in params if p.grad is not None)

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, policy: Policy, directory: Path) -> None:
        self.acc.save_state(str(directory), safe_serialization=True)  # the scheduler and RNG states only
        self.sharding.save(model, optimizer, directory / SHARDS_DIR)
        full = self.sharding.full_state_dict(model, self.sharding.compute_dtype)
        if self.acc.is_main_process:
            with self.sharding.plain_classes(model):
                policy.save_pretrained(model, directory / "model", state_dict=full)

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        self.acc.load_state(str(directory))
        self.sharding.load(model, optimizer, directory / SHARDS_DIR)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model
