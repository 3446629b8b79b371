"""A user reward module for the diffusion tests: the mean red level of the image, which varies
continuously between a random model's samples."""

import numpy as np
from mmrl.rewards import register_reward


@register_reward("mean_red")
def mean_red(prompts, completions, **columns):
    return [float(np.asarray(img.convert("RGB"), dtype=np.float32)[..., 0].mean() / 255) for img in completions]


def redder(a, b, prompt):
    """A pairwise judge for `win_rate`: the redder image wins (a tie: 0.5); it names the group's
    prompt, which it checks it is given."""
    assert isinstance(prompt, str) and prompt
    ra, rb = mean_red([prompt] * 2, [a, b])
    return 1.0 if ra > rb else 0.0 if ra < rb else 0.5
