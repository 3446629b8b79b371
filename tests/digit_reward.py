"""A user reward module (loaded through `reward_modules`): the share of digits in the
completion, which already varies between a random model's samples."""

from mmrl.rewards import register_reward


@register_reward("digit_share")
def digit_share(prompts, completions, **columns):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
