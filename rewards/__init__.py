"""Reward functions: ``fn(prompts, completions, **columns) -> list[float | None]``.

``@register_reward(name)`` adds one; ``get_reward(name)`` returns it. Importing this package
registers the built-ins: ``format``, ``accuracy``, ``length``.
"""

from mmrl.core.scoring import REWARDS, get_reward, register_reward

from . import accuracy, format, length  # noqa: F401  (registration)

from . import latex_render  # noqa: F401,E402  (registration)
from . import iou  # noqa: F401,E402  (registration)
from . import wer  # noqa: F401,E402  (registration)
from . import t_grpo  # noqa: F401,E402  (registration)
from . import length_bonus  # noqa: F401,E402  (registration)
from . import colour_shape  # noqa: F401,E402  (registration)
from . import clip  # noqa: F401,E402  (registration)

__all__ = ["REWARDS", "get_reward", "register_reward"]
