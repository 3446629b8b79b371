"""A benchmark scorer's model (a detector, a judge, a feature network) from a local folder or a hub
id: a local path that does not exist is refused naming the benchmark option that gave it, before
transformers would try it as a hub id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LOCAL_PREFIXES = (".", "/", "~")  # a path written as a local one; anything else may be a hub id


def scorer_model(model_class: Any, path: str, option: str, device: str, **kwargs: Any) -> Any:
    """`model_class.from_pretrained(path, **kwargs)` on `device` in eval mode; `option` (e.g.
    ``geneval: detector_path``) names the setting in the error of a missing local folder."""
    if path.startswith(LOCAL_PREFIXES) and not Path(path).expanduser().exists():
        raise FileNotFoundError(f"{option} {path!r} does not exist (a model folder or a hub id)")
    return model_class.from_pretrained(path, **kwargs).to(device).eval()
