"""The values a meta trace (`meta_trace.py`) keeps beside its meta tensors: those of small integer
and boolean tensors (token ids, attention masks, the lengths summed from them) whose inputs are all
known, computed on the CPU as the operator runs on meta. A text encoder's padding mask made on the
CPU by its tokenizer and moved to the meta device keeps its values, so a prompt's unpadded tokens
selected by it (`hidden[mask]`, Qwen-Image's and Z-Image's), the lengths read off it (`.tolist()`)
and a mask the family pads from them are the run's, not a guess.

A floating-point tensor's value is never known (the weights are not there); an operator with such an
input has no known output, and an operator that writes into a known tensor from an unknown one
makes that storage unknown from then on."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.weak import WeakTensorKeyDictionary

MOST = 1 << 22  # elements: a larger integer or boolean tensor is not kept (a causal mask of 2,048 tokens is)
aten = torch.ops.aten
# operators whose meta kernels take index tensors on the CPU, and need their values for the output's shape
INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten.masked_select.default}


def _untraced(work):
    """`work` run with no dispatch mode on: a trace around the one computing the values (a nested
    `LiveBytes`) does not count the values' CPU tensors, which stand for the meta ones it counts."""
    with _disable_current_modes():
        return work()


def _small_integers(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.is_meta and not tensor.is_floating_point() \
        and not tensor.is_complex() and tensor.numel() <= MOST


class KnownValues:
    """CPU values of meta tensors, by tensor (those viewing a storage written from an unknown value
    forgotten)."""

    def __init__(self):
        self._values = WeakTensorKeyDictionary()

    def of(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The value of the meta tensor `tensor`, or None where it is not known."""
        return self._values.get(tensor)

    def _forget(self, storages: set[int]) -> None:
        """Make unknown every tensor viewing one of `storages` (written from an unknown value)."""
        for tensor in [t for t in self._values.keys() if t.untyped_storage()._cdata in storages]:
            del self._values[tensor]

    def read(self, func, args, kwargs) -> tuple[bool, Any]:
        """(True, the result) of an operator that reads a known meta tensor's values into Python or
        onto the CPU (`.item()`, `.tolist()`); (False, None) for any other."""
        source = args[0] if args else None
        if not isinstance(source, torch.Tensor) or not source.is_meta or (value := self.of(source)) is None:
            return False, None
        if func is aten._local_scalar_dense.default:
            return True, value.item()
        if func is aten._to_copy.default and kwargs.get("device") is not None and \
                torch.device(kwargs["device"]).type != "meta":
            return True, _untraced(lambda: value.to(dtype=kwargs.get("dtype") or value.dtype).clone())
        return False, None

    def indexed(self, func, args):
        """`args` with known index tensors as their CPU values, for an indexing operator."""
        if func not in INDEXING:
            return args
        return tree_map(lambda a: self.of(a) if _small_integers(a) and self.of(a) is not None else a, args)

    def computed(self, func, args, kwargs) -> Any:
        """The meta outputs of an operator whose meta kernel needs its inputs' values (`nonzero`), from
        its result on the CPU; every input's value must be known (else NotImplementedError)."""
        if not all(not a.is_meta or self.of(a) is not None for a in tree_leaves((args, kwargs))
                   if isinstance(a, torch.Tensor)):
            raise NotImplementedError(f"{func}: its output's shape depends on values a meta tensor does not have")
        result = _untraced(lambda: func(*self._on_cpu(args), **self._on_cpu(kwargs)))
        out = _untraced(lambda: tree_map(lambda v: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
                                         if isinstance(v, torch.Tensor) else v, result))
        for meta, value in zip(tree_leaves(out), tree_leaves(result)):
            if _small_integers(meta):
                self._values[meta] = value
        return out

    def _on_cpu(self, tree: Any) -> Any:
        return tree_map(lambda a: self.of(a) if isinstance(a, torch.Tensor) and a.is_meta else
                        torch.device("cpu") if isinstance(a, torch.device) and a.type == "meta" else a, tree)

    def record(self, func, args, kwargs, out) -> None:
        """Compute on the CPU the values of `out`'s small integer and boolean meta tensors where every
        input's value is known (or on the CPU); else, for an operator writing into its inputs, make
        what it wrote unknown."""
        inputs = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        known = all(not a.is_meta or self.of(a) is not None for a in inputs)
        if not known:
            if func._schema.is_mutable:
                self._forget({a.untyped_storage()._cdata for a in inputs if a.is_meta and a in self._values})
            return
        outputs = tree_leaves(out)
        if not any(_small_integers(o) for o in outputs):
            return
        for meta, value in zip(outputs, tree_leaves(_untraced(lambda: func(*self._on_cpu(args), **self._on_cpu(kwargs))))):
            if _small_integers(meta) and isinstance(value, torch.Tensor):
                self._values[meta] = value
