"""What travels between a run and a reward server: a request's rows as JSON, and its hash.

Values are JSON as they are, except the ones JSON cannot hold, tagged by a one-key object: a PIL
image as ``{"__png__": base64}`` (lossless), a numpy array or torch tensor as ``{"__array__":
base64, "dtype", "shape"}`` (an audio clip is ``{"array": ..., "sampling_rate": hz}`` with its
array so tagged), a tuple as a list. Decoding gives the image back as an RGB/L/... PIL image and
the array as numpy, so a reward sees on the server what it sees in process (a tensor arrives as
numpy)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from typing import Any

import numpy as np

IMAGE, ARRAY = "__png__", "__array__"


def encode(value: Any) -> Any:
    """`value` as JSON-ready data (the module docstring)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "save") and hasattr(value, "mode"):  # a PIL image
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return {IMAGE: base64.b64encode(buffer.getvalue()).decode()}
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return {ARRAY: base64.b64encode(array.tobytes()).decode(), "dtype": array.dtype.str, "shape": list(array.shape)}
    raise TypeError(f"a {type(value).__name__} cannot be sent to a reward server (text, numbers, lists, "
                    "mappings, PIL images and arrays can)")


def decode(value: Any) -> Any:
    """The value `encode` was given (images as PIL, arrays and tensors as numpy)."""
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
    return {k: decode(v) for k, v in value.items()}


def dumps(body: Any) -> bytes:
    """The request body's bytes: the same content always gives the same bytes (sorted keys)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def content_hash(body: bytes) -> str:
    """The hash that names a request in the cache and in a record."""
    return hashlib.sha256(body).hexdigest()
