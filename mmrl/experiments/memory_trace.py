"""A tracer for planning memory before any download: runs a policy's own code on modules built on
the meta device, so that a model of any size is traced without its weights, and counts the bytes
its tensors would take on the device the plan is for.

An operation whose tensor arguments are all real runs for real (token ids, masks, the bookkeeping
that decides what runs); one that touches a meta tensor runs on the meta device (no memory, no
arithmetic: only shapes and dtypes). Moving a tensor between the meta device and a real one keeps
it where it is, so code that moves its inputs to the model's device, or its results to the CPU,
runs unchanged. What cannot run without values (a meta tensor's `.item()`) raises.

`LiveBytes` counts each storage an operation creates (a view or an in-place result of a storage it
did not see created is not counted: the weights, the inputs) until it is freed, and the peak.

Attention is the one operation whose memory depends on the device: `scaled_dot_product_attention`
picks its kernel by device (a fused one keeps O(L) per head for the backward, the plain one the
[L, L] weights), and on the meta device it would pick the plain one. `attention_of(device_type)`
makes it run, on meta tensors, the kernel that device type picks: on a CPU the fused CPU kernel (a
boolean mask made float first); on CUDA flash attention for 16-bit inputs without a mask, the
memory-efficient kernel with one (its mask padded to a multiple of 16 columns), the plain
computation where neither applies (32-bit inputs without a mask whose key heads are grouped).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

META = torch.device("meta")


def _is_meta(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_meta


def _to_meta(value: Any) -> Any:
    return value.to(META) if isinstance(value, torch.Tensor) and not value.is_meta else value


class LiveBytes(TorchDispatchMode):
    """Within the mode: operations run for real or on meta (module docstring), and `live` / `peak`
    count the bytes of the storages they created that are still alive."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._counted: dict[int, int] = {}  # storage key -> bytes
        self._finalizers: list[weakref.finalize] = []

    def reset_peak(self) -> None:
        """The peak from now on starts at what is live now."""
        self.peak = self.live

    def _count(self, tensor: torch.Tensor, seen_inputs: set[int]) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._counted or key in seen_inputs:
            return
        nbytes = storage.nbytes()
        self._counted[key] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self._finalizers.append(weakref.finalize(storage, self._free, key))

    def _free(self, key: int) -> None:
        nbytes = self._counted.pop(key, None)
        if nbytes is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("device") is not None:
            args, kwargs, unchanged = _stay(args, kwargs)
            if unchanged:
                return args[0]
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if any(t.is_meta for t in tensors):
            args, kwargs = tree_map(_to_meta, (args, kwargs))
            if "device" in kwargs:
                kwargs["device"] = META
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage()._cdata for t in tensors}
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._count(value, inputs)
        return out


def _stay(args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    """A move between the meta device and a real one made a move within the tensor's own device:
    (args, kwargs without the device, whether nothing is left to do)."""
    source = args[0]
    if (kwargs["device"].type == "meta") == source.is_meta:
        return args, kwargs, False
    kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking", "pin_memory")}
    same = kwargs.get("dtype") in (None, source.dtype) and kwargs.get("memory_format") is None
    return args, kwargs, same


def traced_peak(work: Callable[[], Any]) -> tuple[int, int, Any]:
    """(peak bytes above the start, bytes still live at the end, what `work` returned: counted in
    the second) of `work` under `LiveBytes`."""
    with LiveBytes() as counter:
        result = work()
    return counter.peak, counter.live, result


def tensor_bytes(value: Any) -> int:
    """The bytes of every distinct storage among the tensors in `value` (nested lists, tuples,
    dicts, and objects' attributes one level down, such as a rollout record's fields)."""
    seen: dict[int, int] = {}
    for leaf in tree_flatten(value)[0]:
        for tensor in _tensors_of(leaf):
            storage = tensor.untyped_storage()
            seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def _tensors_of(leaf: Any) -> list[torch.Tensor]:
    if isinstance(leaf, torch.Tensor):
        return [leaf]
    fields = getattr(leaf, "__dict__", None)
    if not fields:
        return []
    return [t for v in fields.values() for t in tree_flatten(v)[0] if isinstance(t, torch.Tensor)]


def _float_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the additive one the fused kernels take (0 where attended, -inf elsewhere)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask, torch.zeros((), dtype=dtype), torch.full((), float("-inf"), dtype=dtype))


def _cpu_attention(q, k, v, mask, dropout_p, is_causal, scale):
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, dropout_p, is_causal, attn_mask=_float_mask(mask, q.dtype), scale=scale)
    return out[0]


def _cuda_attention(q, k, v, mask, dropout_p, is_causal, scale, plain):
    if mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False,
                                                                  scale=scale)[0]
    if q.shape[1] != k.shape[1]:  # grouped key heads: the memory-efficient kernel does not take them
        return plain()
    if mask is not None:
        mask = _float_mask(mask, q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        padded = -(-mask.shape[-1] // 16) * 16
        mask = F.pad(mask, (0, padded - mask.shape[-1]))[..., :mask.shape[-1]]
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, mask, q.requires_grad, dropout_p,
                                                                  is_causal, scale=scale)[0]


@contextmanager
def attention_of(device_type: str) -> Iterator[None]:
    """`F.scaled_dot_product_attention` on meta tensors runs the kernel `device_type` ("cpu" or
    "cuda") picks (module docstring); on real tensors it is unchanged."""
    plain_attention = F.scaled_dot_product_attention

    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        def plain():
            return plain_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                   scale=scale, enable_gqa=enable_gqa)

        if not query.is_meta:
            return plain()
        if device_type == "cpu":
            return _cpu_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
        return _cuda_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, plain)

    F.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = plain_attention
