"""The allocation trace of work run on meta tensors (the diffusion memory formula's measure,
`memory_formula.py`): a module built without weights runs its forward (and backward) on meta
inputs of the recipe's shapes; no byte is allocated, but every tensor an operator returns is
counted from its creation until its storage's last holder is gone, in the order the CPU allocator
would see it, so the most bytes live at once is the pass's peak at the real size.

A storage is counted once however many tensors view it (`untyped_storage()._cdata`); autograd's
saved tensors are kept as the Python tensors themselves (`saved_tensors_hooks`), so a storage
the graph holds stays counted until the graph frees it. Parameters and buffers, made before the
trace, are not counted (the plan counts the weights apart); parameters' gradients are dropped as
they are accumulated (the plan counts the gradients apart), so only their transient is seen.

Small integer and boolean tensors computed from known values (token ids and attention masks made
by a tokenizer on the CPU, the lengths summed from them) keep their values beside the trace
(`meta_values.py`), so a mask's selection and a length read off it are the run's. Another value
read off a meta tensor (`.item()`, `bool()` of one computed from weights) reads as 1 (True). A
value read off a real tensor (a scheduler's table on the CPU: a DDIM step's alphas) is its own.

On meta tensors PyTorch's scaled-dot-product attention would take its math path (the scores
materialised); the trace runs the fused kernel instead (`fused_attention`, in PyTorch's place while the trace runs: its backward and a
checkpoint's recomputation run on autograd's thread), as the run on a CPU or
a GPU does (flash or memory-efficient attention: the output and its log-sum-exp, no scores)."""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .meta_values import KnownValues


class LiveBytes(TorchDispatchMode):
    """The bytes of operators' outputs live at each moment (`live`) and the most (`peak`)."""

    def __init__(self, known: KnownValues | None = None):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._holders: dict[int, int] = {}  # storage -> live tensors viewing it
        self.known = known or KnownValues()  # small integer and boolean tensors' values (meta_values.py)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        read, value = self.known.read(func, args, kwargs)
        if read:
            return value
        if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:  # 1 (module docstring)
            return True if args[0].dtype == torch.bool else 1
        try:
            out = func(*self.known.indexed(func, args), **kwargs)
        except NotImplementedError:  # a meta kernel that needs values (`nonzero`): computed from the known ones
            out = self.known.computed(func, args, kwargs)
        self.known.record(func, args, kwargs, out)
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._hold(tensor)
        return out

    def _hold(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self._holders:
            self._holders[key] = 0
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        self._holders[key] += 1
        weakref.finalize(tensor, self._release, key, storage.nbytes())

    def _release(self, key: int, nbytes: int) -> None:
        self._holders[key] -= 1
        if not self._holders[key]:
            del self._holders[key]
            self.live -= nbytes


def fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """`F.scaled_dot_product_attention` as the fused kernel (module docstring)."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


def traced_peak(work: Callable[[], Any], module: nn.Module | None = None, known: KnownValues | None = None) -> int:
    """The most bytes live at once while `work` runs on meta tensors (its result dropped at the
    end); with `module`, its parameters' gradients are dropped as soon as they are accumulated;
    `known`: the values of earlier traces' tensors it reads (their conditioning's masks)."""
    hooks = [p.register_post_accumulate_grad_hook(_drop_grad) for p in module.parameters() if p.requires_grad] \
        if module is not None else []
    trace, stock = LiveBytes(known), F.scaled_dot_product_attention
    F.scaled_dot_product_attention = fused_attention
    try:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t), trace:
            work()
    finally:
        F.scaled_dot_product_attention = stock
        for hook in hooks:
            hook.remove()
    return trace.peak


def _drop_grad(parameter: torch.Tensor) -> None:
    parameter.grad = None
