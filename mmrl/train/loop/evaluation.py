"""Held-out scoring: the quantity RL optimises, and greedy decoding beside it.

`reward_mean` is the mean combined reward (`combine`: weighted sum, gate or product) of `group_size` samples per held-out prompt at the
rollout temperature (`reward_mean_se` its standard error over prompts); `greedy_reward_mean` decodes once per prompt without sampling. Each reward
is reported on its own as well (``reward/<name>``, ``greedy/<name>``), and so are the counts a
reward logs (``reward/<name>/<key>``, see `mmrl.core.scoring`).

An `Evaluator` (a demo's second judge, registered in `mmrl.registry.DEMO_EVALUATORS`; never a
training reward) scores the very same samples: ``eval_mean`` (sampled, with ``eval_mean_se``)
and ``greedy_eval_mean``, the counts it logs as ``eval/<key>``, and for each of its `variants`
(held-out rows transformed, e.g. a video's frames shuffled) the same two on fresh rollouts of
the transformed rows: ``eval_mean/<variant>``, ``greedy_eval_mean/<variant>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from mmrl.core.advantages import combined_total
from mmrl.core.policy import Policy
from mmrl.core.scoring import compute_rewards, reward_columns, score_rollout
from mmrl.core.seeding import derive_seed
from mmrl.train.reporting.tracking import Progress

EVAL_SEED_SALT = 0xE7A1


@dataclass(frozen=True)
class Evaluator:
    """A held-out judge beside the training reward (never used as one).

    `score` has a reward's call shape, ``fn(prompts, completions, **columns) -> list[float | None]``
    (it may take ``log_metric`` to log counts, reported as ``eval/<key>``); `name` says what it
    measures (it is written to ``summary.json``). `variants`: name -> ``fn(row) -> row``, held-out
    rows transformed (e.g. frames shuffled) on which the evaluator is measured again.
    """

    name: str
    score: Callable[..., list[float | None]]
    variants: Mapping[str, Callable[[dict], dict]] = field(default_factory=dict)


def _mean_se(values: list[float], group_size: int) -> tuple[float, float]:
    """The mean, and its standard error over prompts (the samples of one prompt are correlated)."""
    if not values:
        return float("nan"), float("nan")
    per_prompt = torch.tensor(values).view(-1, group_size).nanmean(dim=1)
    per_prompt = per_prompt[~per_prompt.isnan()]
    se = float(per_prompt.std() / len(per_prompt) ** 0.5) if len(per_prompt) > 1 else 0.0
    return float(torch.nanmean(torch.tensor(values))), se


def _score(policy: Policy, rows: Sequence[dict], reward_fns: Mapping[str, Callable],
           weights: Mapping[str, float], group_size: int, seed: int, greedy: bool,
           prompts_per_call: int, combine: str, gates: Mapping[str, float] | None,
           evaluator: Evaluator | None = None, records: list[dict] | None = None,
           show_progress: bool = False, kept_rows: int | None = None) -> dict[str, float]:
    """Score `group_size` samples per row; with `records`, append each row's samples, rewards and
    evaluator values to it ({"row", "completions", "rewards", "eval", and "columns": the columns the
    policy gave the samples, e.g. a video's fps, an episode's tool calls}) for the first `kept_rows` rows (None: all);
    with `show_progress`, a bar over the rows."""
    totals: list[float] = []
    per_reward: dict[str, list[float]] = {k: [] for k in reward_fns}
    judged: list[float] = []
    counts: dict[str, float] = {}  # what the rewards log about these calls
    eval_counts: dict[str, float] = {}
    progress = Progress(len(rows), enabled=show_progress, desc=f"eval ({'greedy' if greedy else 'sampled'})",
                        leave=False)
    for start in range(0, len(rows), prompts_per_call):
        chunk = rows[start:start + prompts_per_call]
        seeds = [derive_seed(seed, EVAL_SEED_SALT, start + i) for i in range(len(chunk))]
        rollout = policy.rollout(chunk, group_size, seeds, greedy=greedy)
        own = tuple(rollout.columns)  # the policy's columns, before the data's join them
        rollout.add_data_columns(chunk)
        kept, rewards, _ = score_rollout(reward_fns, rollout, counts)
        total = combined_total(rewards, dict(weights), combine, dict(gates or {}))
        totals += total.tolist()
        for k, v in rewards.items():
            per_reward[k] += v.tolist()
        values = None
        if evaluator is not None:
            values = compute_rewards({evaluator.name: evaluator.score}, kept.prompts, kept.completions,
                                     reward_columns(kept), eval_counts)[evaluator.name].tolist()
            judged += values
        if records is not None:
            for i, row in enumerate(chunk[:None if kept_rows is None else max(kept_rows - start, 0)]):
                span = slice(i * group_size, (i + 1) * group_size)
                records.append({"row": row, "completions": list(kept.completions[span]),
                                "rewards": total[span].tolist(),
                                "eval": values[span] if values is not None else None,
                                "columns": {k: list(kept.columns[k][span]) for k in own}})
        progress.update(start + len(chunk), {})
    progress.close()
    out = dict(zip(("reward_mean", "reward_mean_se"), _mean_se(totals, group_size)))
    mean = lambda xs: float(torch.nanmean(torch.tensor(xs))) if xs else float("nan")  # noqa: E731
    out.update({f"reward/{k}": mean(v) for k, v in per_reward.items()})
    out.update(counts)  # the rewards' own counts for these calls
    if evaluator is not None:
        out.update(zip(("eval_mean", "eval_mean_se"), _mean_se(judged, group_size)))
        out.update({k.replace(f"reward/{evaluator.name}/", "eval/"): v for k, v in eval_counts.items()})
    return out


@torch.no_grad()
def evaluate(policy: Policy, rows: Sequence[dict], reward_fns: Mapping[str, Callable],
             weights: Mapping[str, float], group_size: int, seed: int,
             prompts_per_call: int = 16, combine: str = "sum",
             gates: Mapping[str, float] | None = None, evaluator: Evaluator | None = None,
             keep_samples: bool = False, show_progress: bool = False,
             kept_rows: int | None = None) -> dict[str, Any]:
    """The scores; with `keep_samples`, also ``samples`` (of the first `kept_rows` rows, None: all;
    a video's samples are large): per row {"row", "completions", "rewards", "eval", "columns" (the
    sampled ones), "greedy", "greedy_reward", "greedy_eval", "greedy_columns"}; with
    `show_progress`, a bar over the rows of each pass."""
    if not rows:
        raise ValueError("evaluation needs held-out rows (data.eval_path or a data set with an eval split)")
    sampled_records: list[dict] | None = [] if keep_samples else None
    greedy_records: list[dict] | None = [] if keep_samples else None
    sampled = _score(policy, rows, reward_fns, weights, group_size, seed, False, prompts_per_call, combine, gates,
                     evaluator, sampled_records, show_progress, kept_rows)
    greedy = _score(policy, rows, reward_fns, weights, 1, seed, True, prompts_per_call, combine, gates,
                    evaluator, greedy_records, show_progress, kept_rows)
    out: dict[str, Any] = dict(sampled)
    out["greedy_reward_mean"] = greedy.pop("reward_mean")
    greedy.pop("reward_mean_se")
    if evaluator is not None:
        out["greedy_eval_mean"] = greedy.pop("eval_mean")
        greedy.pop("eval_mean_se")
    out.update({k.replace("reward/", "greedy/").replace("eval/", "greedy_eval/"): v for k, v in greedy.items()})
    for variant, transform in (evaluator.variants if evaluator is not None else {}).items():
        moved = [transform(dict(row)) for row in rows]
        for greedy_pass, key in ((False, "eval_mean"), (True, "greedy_eval_mean")):
            scores = _score(policy, moved, reward_fns, weights, 1 if greedy_pass else group_size, seed, greedy_pass,
                            prompts_per_call, combine, gates, evaluator)
            out[f"{key}/{variant}"] = scores["eval_mean"]
    if keep_samples:
        out["samples"] = [{**s, "greedy": g["completions"][0], "greedy_reward": g["rewards"][0],
                           "greedy_eval": g["eval"][0] if g["eval"] is not None else None,
                           "greedy_columns": g["columns"]}
                          for s, g in zip(sampled_records, greedy_records)]
    return out
