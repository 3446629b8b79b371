"""What travels between a run and its servers (reward, rollout): a request's rows as JSON, and its hash.

Values are JSON as they are, except the ones JSON cannot hold, tagged by a one-key object: a PIL
image as ``{"__png__": base64}`` (lossless), a numpy array or torch tensor as ``{"__array__":
base64, "dtype", "shape"}`` (an audio clip is ``{"array": ..., "sampling_rate": hz}`` with its
array so tagged), a tuple as a list. Decoding gives the image back as an RGB/L/... PIL image and
the array as numpy, so a reward sees on the server what it sees in process (a tensor arrives as
numpy).

With ``exact=True`` (what a rollout record needs: serving/rollout_wire.py) a torch tensor keeps its
type and dtype, bfloat16 included, as ``{"__tensor__": base64, "dtype", "shape"}``, and a tuple as
``{"__tuple__": [...]}``; decoding gives back a torch tensor and a tuple."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from typing import Any

import numpy as np

IMAGE, ARRAY, TENSOR, TUPLE = "__png__", "__array__", "__tensor__", "__tuple__"


def encode(value: Any, exact: bool = False) -> Any:
    """`value` as JSON-ready data (the module docstring; `exact`: tensors and tuples kept as such)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): encode(v, exact) for k, v in value.items()}
    if exact and isinstance(value, tuple):
        return {TUPLE: [encode(v, exact) for v in value]}
    if isinstance(value, (list, tuple)):
        return [encode(v, exact) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return {IMAGE: base64.b64encode(buffer.getvalue()).decode()}
    if hasattr(value, "detach"):  # a torch tensor
        if exact:
            return _tensor(value)
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return {ARRAY: base64.b64encode(array.tobytes()).decode(), "dtype": array.dtype.str, "shape": list(array.shape)}
    raise TypeError(f"a {type(value).__name__} cannot be sent to a server (text, numbers, lists, mappings, PIL "
                    "images and arrays can)")


def _tensor(value: Any) -> dict:
    """A torch tensor's bytes, dtype and shape (a dtype numpy lacks, bfloat16, travels as its bits)."""
    import torch
    tensor = value.detach().cpu().contiguous()
    dtype = str(tensor.dtype).removeprefix("torch.")
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return {TENSOR: base64.b64encode(tensor.numpy().tobytes()).decode(), "dtype": dtype, "shape": list(value.shape)}


def _decode_tensor(value: dict) -> Any:
    import torch
    dtype = getattr(torch, value["dtype"])
    stored = torch.int16 if dtype == torch.bfloat16 else dtype
    data = bytearray(base64.b64decode(value[TENSOR]))  # writable: the tensor owns a copy
    tensor = torch.frombuffer(data, dtype=stored) if data else torch.empty(0, dtype=stored)
    return tensor.view(dtype).reshape(value["shape"])


def decode(value: Any) -> Any:
    """The value `encode` was given (images as PIL, arrays and tensors as numpy; with `exact`, tensors and tuples)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if IMAGE in value:
        from PIL import Image
        image = Image.open(io.BytesIO(base64.b64decode(value[IMAGE])))
        image.load()
        return image
    if ARRAY in value:
        data = np.frombuffer(base64.b64decode(value[ARRAY]), dtype=np.dtype(value["dtype"]))
        return data.reshape(value["shape"]).copy()
    if TENSOR in value:
        return _decode_tensor(value)
    if TUPLE in value:
        return tuple(decode(v) for v in value[TUPLE])
    return {k: decode(v) for k, v in value.items()}


def dumps(body: Any) -> bytes:
    """The request body's bytes: the same content always gives the same bytes (sorted keys)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def content_hash(body: bytes) -> str:
    """The hash that names a request in the cache and in a record."""
    return hashlib.sha256(body).hexdigest()
