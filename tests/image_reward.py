"""A user reward module for the diffusion tests: the mean red level of the image, which varies
continuously between a random model's samples."""

import numpy as np
from mmrl.rewards import register_reward


@register_reward("mean_red")
def mean_red(prompts, completions, **columns):
    return [float(np.asarray(img.convert("RGB"), dtype=np.float32)[..., 0].mean() / 255) for img in completions]
