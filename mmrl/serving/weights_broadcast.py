"""The trained weights sent to a process that generates over torch.distributed (docs/async.md): the
rollout worker, or a rollout server (docs/distributed.md#served-rollouts). The trainer (rank 0) and the
receiver (rank 1) form a process group of their own, on a TCPStore of their own on a free port of the
trainer's address (127.0.0.1 unless the receiver is on another machine), so the trainer's default
process group, if it has one, is left alone. The backend is chosen from the two models' devices: NCCL
between two different CUDA devices, gloo (CPU copies) otherwise. Only gloo is tested.

A transfer is a part of the state dict flattened into one buffer per dtype (`flatten`), broadcast from
the trainer: the whole state dict (parameters and persistent buffers) first, then after every update
the parameters the optimizer trains and the buffers, where the model has frozen parameters (with
LoRA: the adapter's tensors, the base weights never change), else the whole state dict again. The
trainer's broadcast is asynchronous: it copies the weights into buffers of their own, starts the
broadcast and goes on training; the receiver receives the buffers when it reads the transfer's message
(("weights", version, part) from the trainer: mmrl/train/placement/rollout_worker.py,
serving/rollout_server.py) and copies them into its model in place. The buffers of a completed
broadcast are reused by the next transfer of the same part; a failed one (the receiver died: its
connection closed) raises there. Several receivers (rollout servers) each have a group of their own
with the trainer and are broadcast the same buffers.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import torch
import torch.distributed as dist

LOCAL_HOST = "127.0.0.1"
# How long a broadcast may wait for the other side: the trainer's waits while the worker finishes the
# generation calls it is in; a dead peer fails at once (its connection closes), a hung one after this.
TRANSFER_TIMEOUT = datetime.timedelta(hours=1)
# How long forming the group may wait for the other side: both enter it once the receiver has built its
# model and said so (WORKER_DEVICE_KEY), so only a side that died meanwhile keeps the other waiting.
JOIN_TIMEOUT = datetime.timedelta(minutes=2)
WORKER_DEVICE_KEY = "worker_device"
# The parts of the state dict a transfer carries: the whole of it, or the parameters the optimizer trains
WHOLE, TRAINED = "whole", "trained"

# [(name, shape, dtype)] of a part of the trainer's state dict, in its order
Layout = list[tuple[str, tuple[int, ...], torch.dtype]]


def layout_of(state: dict[str, torch.Tensor]) -> Layout:
    return [(name, tuple(t.shape), t.dtype) for name, t in state.items()]


def transfer_layouts(model: torch.nn.Module) -> dict[str, Layout]:
    """The layouts of the two parts a transfer may carry: WHOLE (the state dict) and TRAINED (its
    entries that may change in training: the parameters the optimizer trains, those that require
    grad, and the persistent buffers, which a forward may update, as a batch norm's statistics)."""
    state = model.state_dict(keep_vars=True)
    return {WHOLE: layout_of(state), TRAINED: [(name, tuple(t.shape), t.dtype) for name, t in state.items()
                                               if t.requires_grad or not isinstance(t, torch.nn.Parameter)]}


def part_after_updates(model: torch.nn.Module) -> str:
    """What the transfers after the first carry: TRAINED where some parameters are frozen (LoRA: the
    adapter's tensors; frozen weights never change), else the whole state dict."""
    return TRAINED if any(not p.requires_grad for p in model.parameters()) else WHOLE


def backend_for(trainer_device: torch.device, worker_device: torch.device) -> str:
    """nccl between two different CUDA devices (one device cannot be two NCCL ranks), gloo otherwise."""
    both_cuda = trainer_device.type == worker_device.type == "cuda"
    return "nccl" if both_cuda and trainer_device.index != worker_device.index else "gloo"


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _group(store: dist.Store, rank: int, backend: str, device: torch.device, host: str) -> dist.ProcessGroup:
    """The pair's group; `host`: this side's own address (gloo's connections)."""
    if backend == "nccl":
        torch.cuda.set_device(device)
        return dist.ProcessGroupNCCL(store, rank, 2, JOIN_TIMEOUT)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = JOIN_TIMEOUT
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(store, rank, 2, options)


def _broadcast(group: dist.ProcessGroup, buffer: torch.Tensor) -> dist.Work:
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor, options.timeout = 0, 0, TRANSFER_TIMEOUT
    return group.broadcast([buffer], options)


def _by_dtype(layout: Layout) -> dict[torch.dtype, list[tuple[str, tuple[int, ...]]]]:
    buckets: dict[torch.dtype, list[tuple[str, tuple[int, ...]]]] = {}
    for name, shape, dtype in layout:
        buckets.setdefault(dtype, []).append((name, shape))
    return buckets


def _numel(shape: tuple[int, ...]) -> int:
    return int(torch.Size(shape).numel())


def _buffers(layout: Layout, device: torch.device) -> list[torch.Tensor]:
    """One empty buffer per dtype of `layout`, in `_by_dtype`'s order."""
    return [torch.empty(sum(_numel(shape) for _, shape in entries), dtype=dtype, device=device)
            for dtype, entries in _by_dtype(layout).items()]


def transfer_bytes(layout: Layout) -> int:
    """The bytes a transfer of `layout` carries."""
    return sum(_numel(shape) * dtype.itemsize for _, shape, dtype in layout)


def flatten(state: dict[str, torch.Tensor], layout: Layout, device: torch.device,
            into: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The entries of `layout` in the state dict, copied into one buffer per dtype on `device`; `into`:
    the buffers of an earlier transfer of the same layout, reused."""
    buffers = into if into is not None else _buffers(layout, device)
    with torch.no_grad():
        for buffer, entries in zip(buffers, _by_dtype(layout).values(), strict=True):
            offset = 0
            for name, shape in entries:
                buffer[offset:offset + _numel(shape)].copy_(state[name].reshape(-1))
                offset += _numel(shape)
    return buffers


class WeightsSender:
    """The trainer's side: opens the store, waits for the receiver to join, broadcasts transfers of the
    parts of `layouts` (`transfer_layouts` of the trainer's model). `host`: the trainer's address as the
    receiver reaches it."""

    def __init__(self, layouts: dict[str, Layout], host: str = LOCAL_HOST) -> None:
        self.layouts, self.host = layouts, host
        self.store = dist.TCPStore(host, 0, 2, is_master=True, wait_for_workers=False)
        self.port = self.store.port
        self.group: dist.ProcessGroup | None = None
        self.device = torch.device("cpu")
        # part, buffers, their broadcasts, and whether the buffers are this sender's own (reused once completed)
        self.sending: list[tuple[str, list[torch.Tensor], list[dist.Work], bool]] = []
        self.spare: tuple[str, list[torch.Tensor]] | None = None  # a completed transfer's part and buffers, reused

    def connect(self, trainer_device: torch.device, wait: Callable[[], None]) -> None:
        """Form the group once the receiver has joined; `wait` is called meanwhile (it raises if the
        receiver died). A receiver that dies while the group forms fails it (RuntimeError)."""
        while not self.store.check([WORKER_DEVICE_KEY]):
            wait()
        worker_device = torch.device(self.store.get(WORKER_DEVICE_KEY).decode())
        backend = backend_for(trainer_device, worker_device)
        self.device = trainer_device if backend == "nccl" else torch.device("cpu")
        self.group = _group(self.store, 0, backend, self.device, self.host)

    def send(self, model: torch.nn.Module, part: str) -> None:
        """Copy `part` of the weights into buffers of their own and start their broadcast (the receiver
        receives them when it reads the transfer's message)."""
        self.release_sent()
        spare, self.spare = self.spare, None
        into = spare[1] if spare is not None and spare[0] == part else None
        self.broadcast(part, flatten(model.state_dict(), self.layouts[part], self.device, into), own=True)

    def broadcast(self, part: str, buffers: list[torch.Tensor], own: bool = False) -> None:
        """Start the broadcast of buffers `flatten` filled with `part`, kept until it completes (`own`: then
        reused by `send`; buffers shared with other senders are not)."""
        self.release_sent()
        self.sending.append((part, buffers, [_broadcast(self.group, buffer) for buffer in buffers], own))

    def release_sent(self) -> None:
        """Keep the buffers of the completed transfers for the next; a failed one raises its error
        (RuntimeError)."""
        waiting = []
        for part, buffers, works, own in self.sending:
            if all(work.is_completed() for work in works):
                for work in works:
                    work.wait()
                self.spare = (part, buffers) if own else self.spare
            else:
                waiting.append((part, buffers, works, own))
        self.sending = waiting

    def close(self) -> None:
        """Leave the group (once the receiver has stopped: its transfers are done or failed)."""
        self.sending, self.spare, self.group = [], None, None


class WeightsReceiver:
    """The receiver's side: joins the trainer's store (at `host`:`port`) and group, receives transfers into
    its model; `own_host`: its own address as the trainer reaches it."""

    def __init__(self, port: int, layouts: dict[str, Layout], model: torch.nn.Module, trainer_device: torch.device,
                 host: str = LOCAL_HOST, own_host: str = LOCAL_HOST):
        own = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        theirs = {name: shape for name, shape, _ in layouts[WHOLE]}
        if own != theirs:
            differ = sorted(set(own.items()) ^ set(theirs.items()))[:4]
            raise RuntimeError(f"the receiver's model (rollout worker or server) differs from the trainer's: {differ}")
        self.layouts, self.model = layouts, model
        device = model_device(model)
        backend = backend_for(trainer_device, device)
        self.device = device if backend == "nccl" else torch.device("cpu")
        self.buffers: tuple[str, list[torch.Tensor]] | None = None  # the last transfer's part and buffers
        store = dist.TCPStore(host, port, 2, is_master=False)
        store.set(WORKER_DEVICE_KEY, str(device))
        self.group = _group(store, 1, backend, self.device, own_host)

    def receive(self, part: str) -> None:
        """The next transfer, of `part`, copied into the model in place (cast to its dtypes where they
        differ). The copies bump the parameters' version counters, as a checkpoint load does: a
        policy's vLLM engine sees its weights stale by them (`vllm_weights.weights_fingerprint`) and is
        sent the new ones before its next rollout. The buffers are kept for the next transfer of the
        same part (those of the first, whole one are freed when the trained part follows)."""
        layout = self.layouts[part]
        buffers = self.buffers[1] if self.buffers is not None and self.buffers[0] == part \
            else _buffers(layout, self.device)
        self.buffers = None
        state = self.model.state_dict()
        with torch.no_grad():
            for buffer, entries in zip(buffers, _by_dtype(layout).values(), strict=True):
                _broadcast(self.group, buffer).wait()
                offset = 0
                for name, shape in entries:
                    state[name].copy_(buffer[offset:offset + _numel(shape)].view(shape))
                    offset += _numel(shape)
        self.buffers = part, buffers
