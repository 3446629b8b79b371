"""The memory plan (`mmrl plan`, docs/memory-plan.md): one process's peak memory in a recipe's
training step, by component, computed from the model's configuration alone (its weightless build:
no weights are read), and the largest group size, micro-batch and input sizes (the formula's
`size_axes`: a resolution, a frame count) that fit a device's memory.

Analytic, not traced: the training state is the weightless build's parameter count in its dtype
(LoRA: the adapters alone take gradients and AdamW state; else the parameters the adapter trains,
those of parts it freezes marked `requires_grad=False` in the build), each part divided as the strategy divides
it (`mmrl.distributed.state_shares`); the passes' memory is the adapter's formula
(`Policy.memory_model`, mmrl/core/memory_model.py). The step's peak is the training state plus the
largest of a generation call's memory, a micro-batch's forward and backward, and the pass the
first step adds to it (a check of the fused log-probs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from mmrl.config.parse import from_dict
from mmrl.config.rollouts import adapter_policy
from mmrl.config.sections import TrainConfig
from mmrl.core.lora import with_lora
from mmrl.core.memory_model import MemoryModel, SizeAxis
from mmrl.core.regularisers import regulariser_needs
from mmrl.distributed import state_shares
from mmrl.errors import UserError, reading_user_input
from mmrl.registry import ADAPTERS

MIB = 2 ** 20
LARGEST = 1 << 16  # the largest group size or micro-batch searched


@dataclass
class MemoryPlan:
    """One process's memory in a step (bytes by component) and what fits."""

    family: str
    parameters: int                  # the model's, whole
    trainable: int                   # those taking gradients (LoRA: the adapters')
    # rollouts per generation call ("rollout"), per update pass ("update"), per group; the step's prompts and rows
    rows: dict[str, int]
    state: dict[str, int]            # weights, reference weights, gradients, optimizer state, frozen weights: ...
    update: dict[str, int]           # at the peak of one micro-batch's forward and backward
    first_step: dict[str, int]       # a pass the first step adds to its first micro-batch (a check)
    rollout: dict[str, int]          # one generation call's cache and sampler
    activations_other: int           # the activations with the other checkpointing setting (not in the peak)
    checkpointing: bool              # the recipe's setting, the one in the peak
    peak: int                        # state + the largest of update, first_step and rollout
    host: dict[str, int] = field(default_factory=dict)  # what the step's rollouts keep in host memory (not in the peak)
    device_memory: int | None = None     # bytes, --gpu-memory
    largest_group_size: int | None = None   # that fits device_memory at the recipe's micro-batch (0: none)
    largest_micro_batch: int | None = None  # that fits at the recipe's group size, at most a process's rows (0: none)
    # per input size the formula searches ("resolution", "frames"): the settings of its largest value that
    # fits at the recipe's group size, micro-batch and other sizes (field -> value; {}: none fits)
    largest_sizes: dict[str, dict[str, int]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _state(cfg: TrainConfig, model: MemoryModel, processes: int) -> tuple[dict[str, int], int, int]:
    """(training state by component, whole parameters, trainable parameters)."""
    shares = state_shares(cfg.distributed, processes)
    params = list(model.module.parameters())
    whole = sum(p.numel() for p in params)
    size = (lambda p: 4) if shares.fp32_master else (lambda p: p.element_size())  # noqa: E731
    weights = sum(p.numel() * size(p) for p in params)  # parts of a model may differ (a composite's)
    if cfg.optim.lora.r:
        adapters = [p for p in with_lora(model.module, cfg.optim.lora).parameters() if p.requires_grad]
        trainable = sum(p.numel() for p in adapters)
        trained_bytes = trainable * adapters[0].element_size()
        weights += trained_bytes
    else:  # the parameters the adapter trains (a frozen part, marked by the adapter's formula, takes no state)
        trained = [p for p in params if p.requires_grad]
        trainable, trained_bytes = sum(p.numel() for p in trained), sum(p.numel() * size(p) for p in trained)
    reference = weights if regulariser_needs(cfg.algorithm, "reference") and not cfg.optim.lora.r else 0
    state = {"weights": int(weights * shares.weights), "reference weights": int(reference * shares.weights),
             "gradients": int(trained_bytes * shares.gradients),
             "optimizer state": int(2 * trained_bytes * shares.optimizer),
             **{f"frozen weights: {name}": size for name, size in model.frozen_bytes().items()}}
    return state, whole, trainable


def _rows(cfg: TrainConfig, processes: int, group_size: int, micro_batch: int) -> dict[str, int]:
    groups = cfg.optim.prompts_per_step // processes
    per_call = cfg.scoring.groups_per_call or groups
    return {"rollout": group_size * min(per_call, groups), "update": min(micro_batch, groups * group_size),
            "group": group_size, "prompts": groups, "step": groups * group_size}


def _passes(cfg: TrainConfig, model: MemoryModel, rows: dict[str, int]) -> dict[str, dict[str, int]]:
    """Each pass's bytes by component: the update, the first step's extra pass, the rollout."""
    return {"update": model.update_bytes(rows["update"], rows["prompts"], trains_head=not cfg.optim.lora.r),
            "first step": model.first_step_bytes(rows["update"], rows["prompts"]),
            "rollout": model.rollout_bytes(rows["rollout"], rows["group"])}


def _peak(state: dict[str, int], passes: dict[str, dict[str, int]]) -> int:
    return sum(state.values()) + max(sum(components.values()) for components in passes.values())


def _largest(fits, most: int = LARGEST) -> int:
    """The largest n in 1 .. `most` with fits(n) (fits holds up to some n and no further); 0: none."""
    if not fits(1):
        return 0
    low, high = 1, most
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def plan_memory(cfg: TrainConfig, processes: int, prompt_length: int, device_memory: int | None = None) -> MemoryPlan:
    """The plan of `cfg` on `processes` processes, prompts at most `prompt_length` tokens long;
    with `device_memory` (bytes), the largest group size and micro-batch that fit it."""
    if processes < 1 or cfg.optim.prompts_per_step % processes:
        raise UserError(f"mmrl plan: optim.prompts_per_step={cfg.optim.prompts_per_step} must be a multiple of "
                        f"--gpus {processes}")
    adapter = ADAPTERS.get(cfg.task)
    with reading_user_input():  # a model path or hub id whose configuration cannot be read: one line
        model = adapter.memory_model(from_dict(adapter.Config, adapter_policy(cfg.policy), "policy"), prompt_length)
    state, whole, trainable = _state(cfg, model, processes)
    group, micro = cfg.algorithm.group_size, cfg.optim.micro_batch_size
    rows = _rows(cfg, processes, group, micro)
    passes = _passes(cfg, model, rows)
    plan = MemoryPlan(model.family, whole, trainable, rows, state, passes["update"], passes["first step"],
                      passes["rollout"], model.activation_bytes(rows["update"], not model.checkpointing),
                      model.checkpointing, _peak(state, passes), model.host_bytes(rows["step"], rows["update"]))
    if device_memory is None:
        return plan

    def fits(group_size: int, micro_batch: int) -> bool:
        return _peak(state, _passes(cfg, model, _rows(cfg, processes, group_size, micro_batch))) <= device_memory

    return replace(plan, device_memory=device_memory, largest_group_size=_largest(lambda g: fits(g, micro)),
                   largest_micro_batch=_largest(lambda m: fits(group, m),
                                                most=group * cfg.optim.prompts_per_step // processes),
                   largest_sizes={name: largest_size(axis, lambda sized: _peak(state, _passes(cfg, sized, rows)),
                                                     device_memory) for name, axis in model.size_axes().items()})


def largest_size(axis: SizeAxis, peak, device_memory: int) -> dict[str, int]:
    """The settings of the largest step of `axis` whose formula's `peak` (a function of the formula,
    the training state and rows unchanged) fits `device_memory`; {} where none does."""
    formulas: dict[int, tuple[dict[str, int], MemoryModel]] = {}

    def at(step: int) -> tuple[dict[str, int], MemoryModel]:
        if step not in formulas:
            formulas[step] = axis.at(step)
        return formulas[step]

    step = _largest(lambda s: peak(at(s)[1]) <= device_memory, most=axis.most)
    return at(step)[0] if step else {}


def plan_table(plan: MemoryPlan) -> str:
    """The plan as a text table, components in rows (MiB)."""
    lines = [f"model: {plan.family}, {plan.parameters:,} parameters ({plan.trainable:,} trained)",
             f"rows: {plan.rows['rollout']} per generation call, {plan.rows['update']} per update pass", "",
             f"{'component':<44}{'MiB':>12}"]
    row = lambda name, value: lines.append(f"{name:<44}{value / MIB:>12,.1f}")  # noqa: E731
    for name, value in plan.state.items():
        row(name, value)
    checkpointed = "with" if plan.checkpointing else "without"
    for name, value in plan.update.items():
        row(f"update: {name}" + (f" ({checkpointed} checkpointing)" if name == "activations" else ""), value)
    other = "without" if plan.checkpointing else "with"
    lines.append(f"{'  (activations ' + other + ' checkpointing, not added)':<44}{plan.activations_other / MIB:>12,.1f}")
    for name, value in plan.first_step.items():
        row(f"first step's check: {name}", value)
    for name, value in plan.rollout.items():
        row(f"rollout: {name}", value)
    row("peak (state + the largest pass)", plan.peak)
    for name, value in plan.host.items():
        row(f"host, not in the peak: {name}", value)
    if plan.device_memory is not None:
        lines += ["", f"in {plan.device_memory / 2 ** 30:g} GiB: largest group size {plan.largest_group_size} "
                      f"(at micro-batch {plan.rows['update']}), largest micro-batch {plan.largest_micro_batch} "
                      "(at the recipe's group size, at most a step's rows); 0: none fits"]
        for name, settings in (plan.largest_sizes or {}).items():
            found = " ".join(f"{key}={value}" for key, value in settings.items()) or "none fits"
            lines.append(f"largest {name}: {found} (at the recipe's group size, micro-batch and other sizes)")
    return "\n".join(lines)
