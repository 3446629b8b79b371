"""A user reward module (loaded through `reward_modules`): the share of letters in the
completion; over a random character model's samples it nearly always varies within a group."""

from mmrl.rewards import register_reward


@register_reward("letter_share")
def letter_share(prompts, completions, **columns):
    return [sum(ch.isalpha() for ch in c) / max(len(c), 1) for c in completions]
