"""What a diffusion recipe's pipeline is, read without its weights, so that the recipe is checked
before any model loads: the pipeline's class (with its base classes' names, which pick its
`Family`) and its components' configs (from which the family tells the sizes it can draw). A tiny
pipeline (``tiny:NAME``) is built on the meta device (no weights, no memory); a saved one's
``model_index.json`` and ``COMPONENT/config.json`` are read; a hub id's are the same files, from
the hub's cache or downloaded (a few kilobytes). None where they cannot be read (offline and not
cached, a gated repository): the family then checks the settings once the pipeline has loaded.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..model_loading import TINY_MODELS
from .family import Configs, Family, family_class

INDEX = "model_index.json"


@dataclass(frozen=True)
class PipelineConfigs:
    """A pipeline as its configs describe it."""

    classes: tuple[str, ...]  # the pipeline's class and its base classes, by name
    configs: Configs          # component (vae, transformer, unet, scheduler) -> its config

    @property
    def family(self) -> type[Family] | None:
        return family_class(self.classes)


def loaded_configs(pipe: Any) -> PipelineConfigs:
    """The description of a pipeline built or loaded in memory."""
    configs = {name: dict(module.config) for name, module in pipe.components.items()
               if isinstance(getattr(module, "config", None), dict)}
    return PipelineConfigs(tuple(c.__name__ for c in type(pipe).__mro__), configs)


def described_pipeline(cfg: Any) -> PipelineConfigs | None:
    """The pipeline `policy.model` (with `policy.tiny_args`) names, described without its weights."""
    return _described(cfg.model, json.dumps(cfg.tiny_args, sort_keys=True, default=str))


@functools.lru_cache(maxsize=8)
def _described(model: str, tiny_args: str) -> PipelineConfigs | None:
    if not model:  # refused by the adapter's own checks
        return None
    try:
        if model.startswith("tiny:"):
            with torch.device("meta"):
                return loaded_configs(TINY_MODELS.get(model.removeprefix("tiny:"))(**json.loads(tiny_args)))
        if Path(model).expanduser().is_dir():
            return _from_files(lambda name: Path(model).expanduser() / name)
        from huggingface_hub import hf_hub_download
        return _from_files(lambda name: Path(hf_hub_download(model, name)))
    except Exception:  # noqa: BLE001 (not readable before loading: the loaded pipeline is checked instead)
        return None


def _from_files(file) -> PipelineConfigs:
    """The description from a saved pipeline's files, `file(relative name)` giving each one's path."""
    index = json.loads(file(INDEX).read_text())
    name = index["_class_name"]
    # diffusers' models and a pipeline's own (Stable Audio 3's duration embedder, library "stable_audio_3"):
    # not transformers' (text encoders, tokenizers), not a scheduler
    models = [component for component, entry in index.items()
              if not component.startswith("_") and isinstance(entry, list) and entry[0] not in (None, "transformers")
              and not str(entry[1]).endswith("Scheduler")]
    configs = {component: json.loads(file(f"{component}/config.json").read_text()) for component in models}
    return PipelineConfigs(_class_names(name), configs)


def _class_names(name: str) -> tuple[str, ...]:
    """`name` and, for a pipeline class diffusers knows, its base classes' names."""
    import diffusers
    cls = getattr(diffusers, name, None)
    return tuple(c.__name__ for c in cls.__mro__) if isinstance(cls, type) else (name,)
