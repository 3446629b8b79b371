"""A user reward module whose reward applies to no completion (None for every row)."""

from mmrl.rewards import register_reward


@register_reward("never_applies")
def never_applies(prompts, completions, **columns):
    return [None for _ in completions]
