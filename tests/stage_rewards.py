"""Rewards that report what a staged run is doing (weight 0 in the tests): the number of
completions scored per call, and the data rows' `difficulty` column."""

from mmrl.rewards import register_reward


@register_reward("batch_rows")
def batch_rows(prompts, completions, **columns):
    return [float(len(completions))] * len(completions)


@register_reward("difficulty")
def difficulty(prompts, completions, difficulty, **columns):
    return [float(d) for d in difficulty]
