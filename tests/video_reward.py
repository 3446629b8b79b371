"""A user reward module for the video tests: the mean red level over every frame of a video (a list
of PIL frames), which varies continuously between a random model's samples."""

import numpy as np
from mmrl.rewards import register_reward


@register_reward("mean_red_video")
def mean_red_video(prompts, completions, **columns):
    return [float(np.mean([np.asarray(f.convert("RGB"), dtype=np.float32)[..., 0].mean() / 255 for f in frames]))
            for frames in completions]
