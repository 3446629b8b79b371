"""mmrl: one group-relative RL engine for generative models of every modality.

The engine (this package) never imports a task adapter or a reward by name: they register
themselves (``tasks``, ``rewards`` and any plugin declared under the ``mmrl.plugins`` entry
point group) and are looked up by the names a recipe gives.
"""

from .config import TrainConfig, load_recipe, parse_config
from .policy import Policy
from .reward_registry import get_reward, register_reward
from .rollout import Rollout

__all__ = ["Policy", "Rollout", "TrainConfig", "get_reward", "load_recipe", "parse_config", "register_reward"]
__version__ = "0.1.0"
