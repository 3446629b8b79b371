"""A user reward module (loaded through `reward_modules`) for the scoring-place tests: a reward of
0 that appends the id of the process scoring it to the file `path`, to tell which process scored."""

import os

from mmrl.rewards import register_reward


@register_reward("scoring_pid")
def scoring_pid(prompts, completions, path: str, **columns):
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    return [0.0] * len(completions)
