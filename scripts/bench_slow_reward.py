"""The reward of `bench_rewards.py --served`: the share of digits in a completion, after waiting
`latency` seconds per request of `request_rows` rows (time.sleep, which releases the GIL as a
model's forward on another device would). Loaded by the bench's trainers (`reward_modules`) and by
its `mmrl serve-reward` subprocess (`--reward-module`)."""

import math
import time

from mmrl.rewards import register_reward


@register_reward("slow_digit_share")
def slow_digit_share(prompts, completions, latency: float = 0.2, request_rows: int = 32, **columns):
    time.sleep(latency * math.ceil(len(completions) / request_rows))
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
