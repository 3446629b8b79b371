"""mmrl: one group-relative RL engine for generative models of every modality.

The engine (this package) never imports a task adapter or a reward by name: they register
themselves (``tasks``, ``rewards`` and any plugin declared under the ``mmrl.plugins`` entry
point group) and are looked up by the names a recipe gives.

The public names below are imported on first use, so that ``mmrl --help`` does not load torch.
"""

import importlib

_PUBLIC = {"TrainConfig": "config.sections", "load_recipe": "config.parse", "parse_config": "config.parse",
           "Policy": "core.policy", "get_reward": "core.scoring", "register_reward": "core.scoring",
           "Rollout": "core.rollout", "Trainer": "train.loop.trainer"}

__all__ = ["Policy", "Rollout", "TrainConfig", "Trainer", "get_reward", "load_recipe", "parse_config", "register_reward"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module 'mmrl' has no attribute {name!r}")
