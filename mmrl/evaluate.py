"""Held-out scoring: the quantity RL optimises, and greedy decoding beside it.

`reward_mean` is the mean (weighted) reward of `group_size` samples per held-out prompt at the
rollout temperature (`reward_mean_se` its standard error over prompts); `greedy_reward_mean` decodes once per prompt without sampling. Each reward
is reported on its own as well (``reward/<name>``, ``greedy/<name>``), and so are the counts a
reward logs (``reward/<name>/<key>``, see `mmrl.reward_registry`).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from .advantages import weighted_total
from .policy import Policy
from .reward_registry import score_rollout
from .sampling import derive_seed

EVAL_SEED_SALT = 0xE7A1


def _score(policy: Policy, rows: Sequence[dict], reward_fns: Mapping[str, Callable],
           weights: Mapping[str, float], group_size: int, seed: int, greedy: bool,
           prompts_per_call: int) -> dict[str, float]:
    totals: list[float] = []
    per_reward: dict[str, list[float]] = {k: [] for k in reward_fns}
    counts: dict[str, float] = {}  # what the rewards log about these calls
    for start in range(0, len(rows), prompts_per_call):
        chunk = rows[start:start + prompts_per_call]
        seeds = [derive_seed(seed, EVAL_SEED_SALT, start + i) for i in range(len(chunk))]
        rollout = policy.rollout(chunk, group_size, seeds, greedy=greedy)
        rollout.add_data_columns(chunk)
        _, rewards, _ = score_rollout(reward_fns, rollout, counts)
        totals += weighted_total(rewards, weights).tolist()
        for k, v in rewards.items():
            per_reward[k] += v.tolist()
    mean = lambda xs: float(torch.nanmean(torch.tensor(xs))) if xs else float("nan")  # noqa: E731
    per_prompt = torch.tensor(totals).view(-1, group_size).nanmean(dim=1)
    per_prompt = per_prompt[~per_prompt.isnan()]
    out = {"reward_mean": mean(totals),
           # standard error over prompts (samples of one prompt are correlated)
           "reward_mean_se": float(per_prompt.std() / len(per_prompt) ** 0.5) if len(per_prompt) > 1 else 0.0}
    out.update({f"reward/{k}": mean(v) for k, v in per_reward.items()})
    out.update(counts)  # the rewards' own counts for these calls
    return out


@torch.no_grad()
def evaluate(policy: Policy, rows: Sequence[dict], reward_fns: Mapping[str, Callable],
             weights: Mapping[str, float], group_size: int, seed: int,
             prompts_per_call: int = 16) -> dict[str, float]:
    if not rows:
        raise ValueError("evaluation needs held-out rows (data.eval_path or a data set with an eval split)")
    sampled = _score(policy, rows, reward_fns, weights, group_size, seed, False, prompts_per_call)
    greedy = _score(policy, rows, reward_fns, weights, 1, seed, True, prompts_per_call)
    out = dict(sampled)
    out["greedy_reward_mean"] = greedy.pop("reward_mean")
    greedy.pop("reward_mean_se")
    out.update({k.replace("reward/", "greedy/"): v for k, v in greedy.items()})
    return out
