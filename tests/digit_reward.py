"""A user reward module (loaded through `reward_modules`): the share of digits in the
completion, which already varies between a random model's samples."""

from mmrl.rewards import register_reward


@register_reward("digit_share")
def digit_share(prompts, completions, **columns):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


@register_reward("loudness")
def loudness(prompts, completions, **columns):
    """The mean absolute sample of an audio completion ({"array", "sampling_rate"}), which varies
    between a random speaker's samples."""
    return [float(abs(c["array"]).mean()) if len(c["array"]) else 0.0 for c in completions]
