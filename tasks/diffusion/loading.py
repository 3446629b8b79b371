"""Loading the diffusers pipeline a diffusion recipe names (`policy.model`): a registered tiny
pipeline (``tiny:NAME``, `tasks.model_loading.TINY_MODELS`), a saved pipeline of a class that
diffusers does not know (through the loader registered for it in `PIPELINE_LOADERS`), or any
pipeline `DiffusionPipeline.from_pretrained` loads (hub id or local path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch

from mmrl.registry import Registry

from ..model_loading import DTYPES, TINY_MODELS

# model_index.json's `_class_name` -> fn(path, torch_dtype) -> the loaded pipeline, for pipeline
# classes diffusers does not know; the package that defines such a class registers its loader
PIPELINE_LOADERS: Registry[Callable[[str, torch.dtype], Any]] = Registry("diffusion pipeline loader")


def saved_class_name(path: str) -> str | None:
    """The pipeline class a saved pipeline directory names in its model_index.json (None for
    anything else: a hub id, a folder without the file)."""
    index = Path(path) / "model_index.json"
    if not index.is_file():
        return None
    return json.loads(index.read_text()).get("_class_name")


def diffusers_pipeline(path: str, dtype: torch.dtype) -> Any:
    """Any pipeline diffusers knows, from a hub id or a local path."""
    from diffusers import DiffusionPipeline
    return DiffusionPipeline.from_pretrained(path, torch_dtype=dtype)


def pipeline_loader(path: str) -> Callable[[str, torch.dtype], Any]:
    """The loader registered for the class `path`'s model_index.json names, else diffusers'."""
    name = saved_class_name(path)
    return PIPELINE_LOADERS.get(name) if name is not None and name in PIPELINE_LOADERS else diffusers_pipeline


def load_pipeline(cfg: Any) -> Any:
    """The pipeline of a `DiffusionConfig` (`model`, `tiny_args`, `dtype`)."""
    if cfg.model.startswith("tiny:"):
        pipe = TINY_MODELS.get(cfg.model.removeprefix("tiny:"))(**cfg.tiny_args)
    else:
        pipe = pipeline_loader(cfg.model)(cfg.model, DTYPES[cfg.dtype])
    return pipe if cfg.dtype == "float32" else pipe.to(DTYPES[cfg.dtype])
