"""Sharded training with DeepSpeed ZeRO stage 3 (`distributed.strategy: zero3`, docs/distributed.md).

DeepSpeed partitions the parameters, gradients and AdamW state over the processes (fp32 master
weights; `policy.dtype: bfloat16` is the compute dtype) and gathers each module's parameters with
hooks as its forward and backward run. Every forward is therefore a collective: rollouts,
evaluation and the no-grad passes run in step over the processes (`ParallelView.lockstep`), as
FSDP does with `distributed.rollout_params: sharded`.

mmrl drives the engine itself rather than through `Accelerator.backward`, which would step the
optimizer inside the last backward: the step's micro-batches accumulate (`backward(loss, last)`),
the trainer checks the gradients are finite (`gradients_finite`), and only then steps (`step`) or
drops them (`drop_gradients`). The learning rate follows the trainer's scheduler, which holds the
same parameter groups as DeepSpeed's optimizer; gradient clipping is DeepSpeed's
(`optim.max_grad_norm`). Checkpoints are DeepSpeed's own (each process writes its partitions,
through `Accelerator.save_state`); `model/` gets the gathered weights (`Accelerator.get_state_dict`).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn

from mmrl.config.sections import DistributedConfig, TrainConfig
from mmrl.core.parallel import ParallelView
from mmrl.core.policy import Policy
from mmrl.distributed.strategy import STRATEGIES, StateShares, Strategy, all_finite, sharded_shares
from mmrl.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # policy.dtype -> compute dtype


def available() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def engine_config(cfg: TrainConfig, compute_dtype: torch.dtype) -> dict:
    """The DeepSpeed configuration for the recipe: ZeRO-3, one optimizer step per trainer step
    (micro-batches are the trainer's), mmrl's clipping and offload settings."""
    zero: dict = {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}
    if cfg.distributed.offload:
        zero.update(offload_param={"device": "cpu"}, offload_optimizer={"device": "cpu"})
    return {
        "train_micro_batch_size_per_gpu": 1,  # DeepSpeed's bookkeeping only: mmrl forms the micro-batches
        "gradient_accumulation_steps": 1,     # the trainer marks the step's last backward itself
        "gradient_clipping": cfg.optim.max_grad_norm or 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": compute_dtype == torch.bfloat16},
        "zero_allow_untested_optimizer": True,  # torch's AdamW, as in every other strategy
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2 ** 62,
    }


def accelerator(cfg: TrainConfig, compute_dtype: torch.dtype):
    """An `Accelerator` whose DeepSpeed plugin is `engine_config(cfg)`; gloo on CPU processes."""
    if not available():
        raise UserError("distributed.strategy=zero3 needs DeepSpeed: pip install 'mmrl[deepspeed]' (or deepspeed)")
    from accelerate import Accelerator, InitProcessGroupKwargs
    from accelerate.utils import DeepSpeedPlugin, DistributedType
    handlers = [] if torch.cuda.is_available() else [InitProcessGroupKwargs(backend="gloo")]
    # accelerate drops a DeepSpeed plugin under ACCELERATE_USE_CPU (set for CPU runs of the other
    # strategies); DeepSpeed finds the CPU itself where there is no GPU
    os.environ.pop("ACCELERATE_USE_CPU", None)
    plugin = DeepSpeedPlugin(hf_ds_config=engine_config(cfg, compute_dtype), zero3_init_flag=False)
    acc = Accelerator(deepspeed_plugin=plugin, kwargs_handlers=handlers)
    # the plugin registers its config with transformers, which then builds every model partitioned
    # (deepspeed.zero.Init) from its constructor on; mmrl builds the models whole (every family's
    # loading code, frozen text encoders and VAEs included) and partitions only the policy and the
    # reference, when the trainer prepares them
    from transformers.integrations import unset_hf_deepspeed_config
    unset_hf_deepspeed_config()
    if acc.distributed_type != DistributedType.DEEPSPEED:
        raise UserError(f"distributed.strategy=zero3: accelerate started {acc.distributed_type}, not DeepSpeed")
    return acc


def frozen_sharded(model: nn.Module, cfg: TrainConfig, compute_dtype: torch.dtype) -> nn.Module:
    """`model` partitioned by ZeRO-3 for forward passes only (no optimizer): the frozen reference,
    never a whole replica per process. Returns the module, whose hooks gather its parameters."""
    import deepspeed
    config = {k: v for k, v in engine_config(cfg, compute_dtype).items() if k != "gradient_clipping"}
    config["zero_optimization"] = {k: v for k, v in config["zero_optimization"].items() if k != "offload_optimizer"}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()
    return engine.module


def backward(engine, loss: torch.Tensor, last: bool) -> None:
    """Accumulate `loss`'s gradients; `last`: the step's last backward, after which the gradients
    are reduced into each process's partition."""
    engine.set_gradient_accumulation_boundary(is_boundary=last)
    engine.backward(loss)


def gradients_finite(engine) -> bool:
    """Whether this process's partition of every gradient is finite (after the last backward)."""
    from deepspeed.utils import safe_get_local_grad
    return all_finite(safe_get_local_grad(p) for p in engine.module.parameters() if p.requires_grad)


def step(engine) -> float:
    """Clip (DeepSpeed's `gradient_clipping`), step the optimizer, clear the gradients; returns
    the gradient norm before clipping."""
    engine.step()
    norm = engine.get_global_grad_norm()
    return float(norm) if norm is not None else float("nan")


def drop_gradients(engine) -> None:
    """Forget the accumulated gradients without stepping (a non-finite step is skipped)."""
    engine.optimizer.zero_grad()


class ZeroThreeView(ParallelView):
    """What an adapter sees of a ZeRO-3 run: every forward gathers its layers, so rollouts run in lockstep."""

    lockstep = True
    gathers_in_module_calls = True
    description = "distributed.strategy=zero3"

    def is_sharded(self, model: nn.Module) -> bool:
        """ZeRO-3 partitions every parameter it wraps (each keeps a `ds_id`); a parameter read outside a
        wrapped module's forward (an output head's weight) is this process's partition, not the tensor."""
        return any(hasattr(p, "ds_id") for p in model.parameters())

    @contextmanager
    def whole(self, param: torch.Tensor) -> Iterator[torch.Tensor]:
        """A partitioned parameter gathered (DeepSpeed's `GatheredParameters`, read only) for the block;
        one its module's call has gathered (`gathers_in_module_calls`) as it is, left for that module's
        hooks to free after its gradient is accumulated and reduced into the partitions."""
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
        if not hasattr(param, "ds_id") or param.ds_status == ZeroParamStatus.AVAILABLE:
            yield param
            return
        import deepspeed
        with deepspeed.zero.GatheredParameters([param]):
            yield param


@STRATEGIES.register("zero3")
class ZeroThree(Strategy):
    """DeepSpeed ZeRO stage 3, driven by the trainer (see the module's docstring)."""

    @classmethod
    def state_shares(cls, cfg: DistributedConfig, processes: int) -> StateShares:
        return sharded_shares(cfg, processes)

    @classmethod
    def config_problems(cls, cfg: TrainConfig) -> list[str]:
        problems: list[str] = []
        if cfg.warm_start.steps > 0:
            problems.append(f"warm_start.steps={cfg.warm_start.steps} with distributed.strategy=zero3: the supervised "
                            "warm start runs its own optimizer on the whole model; warm-start with ddp or fsdp, then "
                            "train from that checkpoint's model/ (or set warm_start.steps=0)")
        if cfg.policy.get("dtype", "float32") not in ("float32", "bfloat16"):
            problems.append(f"policy.dtype={cfg.policy['dtype']!r} with distributed.strategy=zero3: float32 or bfloat16")
        if cfg.policy.get("turning_points"):
            problems.append("policy.turning_points with distributed.strategy=zero3: TP-GRPO's turning-point passes "
                            "run as many forwards as each process's samples need, and ZeRO-3 needs every process "
                            "in every forward; use distributed.strategy=fsdp")
        if cfg.policy.get("rollout_engine", "hf") != "hf":
            problems.append(f"policy.rollout_engine={cfg.policy['rollout_engine']!r} with distributed.strategy=zero3: "
                            "a vLLM engine or a rollout server needs the whole weights, which ZeRO-3 never holds in one "
                            "place; use policy.rollout_engine=hf")
        return problems

    def accelerator(self, given=None):
        if given is not None:
            raise ValueError("distributed.strategy=zero3: the trainer builds its own DeepSpeed accelerator")
        self.compute_dtype = DTYPES.get(self.cfg.policy.get("dtype", "float32"), torch.float32)
        self.acc = accelerator(self.cfg, self.compute_dtype)
        return self.acc

    def place(self, model: nn.Module) -> None:
        model.float()  # fp32 master weights; the dtype is DeepSpeed's compute dtype (`engine_config`)

    def view(self) -> ParallelView:
        return ZeroThreeView()

    def frozen(self, model: nn.Module) -> nn.Module:
        return frozen_sharded(model, self.cfg, self.compute_dtype)

    @property
    def lockstep(self) -> bool:
        return True

    @property
    def forwards_in_step(self) -> bool:
        return True

    def no_sync(self, model: nn.Module, last: bool) -> AbstractContextManager:
        return nullcontext()  # the engine accumulates until the boundary `backward` marks

    def backward(self, model: nn.Module, loss: torch.Tensor, last: bool) -> None:
        backward(model, loss, last)

    @staticmethod
    def numel(param: torch.Tensor) -> int:
        return getattr(param, "ds_numel", param.numel())  # a partitioned parameter keeps its whole size here

    def gradients_finite(self, model: nn.Module, params: list[torch.Tensor]) -> bool:
        return gradients_finite(model)

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> float:
        return step(model)  # DeepSpeed clips (optim.max_grad_norm) and steps

    def drop_gradients(self, model: nn.Module, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> float:
        drop_gradients(model)
        return math.nan

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, policy: Policy, directory: Path) -> None:
        self.acc.save_state(str(directory), safe_serialization=True)  # each process writes its partitions
        full = self.acc.get_state_dict(model)  # every process takes part in gathering the weights
        if self.acc.is_main_process:
            policy.save_pretrained(self.unwrap(model), directory / "model", state_dict=full)
