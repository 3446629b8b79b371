"""Reward functions: ``fn(prompts, completions, **columns) -> list[float | None]``.

``@register_reward(name)`` adds one; ``get_reward(name)`` returns it. Importing this package
registers the built-ins: ``format``, ``accuracy``, ``length``.
"""

from mmrl.core.scoring import REWARDS, get_reward, register_reward

from . import (  # noqa: F401  (registration)
    accuracy,
    av_sync,  # noqa: F401,E402  (registration)
    clap,  # noqa: F401,E402  (registration)
    clip,  # noqa: F401,E402  (registration)
    colour_shape,  # noqa: F401,E402  (registration)
    deepeyes,  # noqa: F401,E402  (registration)
    edit_clip,  # noqa: F401,E402  (registration)
    edit_consistency,  # noqa: F401,E402  (registration)
    edit_judge,  # noqa: F401,E402  (registration)
    edit_shift,  # noqa: F401,E402  (registration)
    format,
    judge,  # noqa: F401,E402  (registration)
    iou,  # noqa: F401,E402  (registration)
    latex_render,  # noqa: F401,E402  (registration)
    length,
    length_bonus,  # noqa: F401,E402  (registration)
    mos,  # noqa: F401,E402  (registration)
    win_rate,  # noqa: F401,E402  (registration)
    t_grpo,  # noqa: F401,E402  (registration)
    videoalign,  # noqa: F401,E402  (registration)
    video_motion,  # noqa: F401,E402  (registration)
    video_temporal,  # noqa: F401,E402  (registration)
    speaker_similarity,  # noqa: F401,E402  (registration)
    tts_composite,  # noqa: F401,E402  (registration)
    tts_stability,  # noqa: F401,E402  (registration)
    wer,  # noqa: F401,E402  (registration)
)

__all__ = ["REWARDS", "get_reward", "register_reward"]
