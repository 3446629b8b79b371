"""A stand-in video reward for the video recipes until the video reward contract lands (issue 30:
image rewards on chosen frames, temporal and motion rewards): `colour_shape` scored on the middle
frame of each video (a list of PIL frames); registered when the plugin loads (`demos/__init__`)."""

from __future__ import annotations

from mmrl.rewards import register_reward
from mmrl.rewards.colour_shape import colour_shape


@register_reward("colour_shape_middle_frame")
def colour_shape_middle_frame(prompts, completions, **columns):
    """`colour_shape` of each video's middle frame (needs the `colour` and `shape` columns)."""
    return colour_shape(prompts, [frames[len(frames) // 2] for frames in completions], **columns)
