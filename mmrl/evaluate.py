"""Held-out scoring: the quantity RL optimises, and greedy decoding beside it.

`reward_mean` is the mean combined reward (`combine`: weighted sum, gate or product) of `group_size` samples per held-out prompt at the
rollout temperature (`reward_mean_se` its standard error over prompts); `greedy_reward_mean` decodes once per prompt without sampling. Each reward
is reported on its own as well (``reward/<name>``, ``greedy/<name>``), and so are the counts a
reward logs (``reward/<name>/<key>``, see `mmrl.reward_registry`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from .advantages import combined_total
from .errors import UserError
from .policy import Policy
from .reward_registry import score_rollout
from .sampling import derive_seed

EVAL_SEED_SALT = 0xE7A1


def _score(policy: Policy, rows: Sequence[dict], reward_fns: Mapping[str, Callable],
           weights: Mapping[str, float], group_size: int, seed: int, greedy: bool,
           prompts_per_call: int, combine: str, gates: Mapping[str, float] | None) -> dict[str, float]:
    totals: list[float] = []
    per_reward: dict[str, list[float]] = {k: [] for k in reward_fns}
    counts: dict[str, float] = {}  # what the rewards log about these calls
    for start in range(0, len(rows), prompts_per_call):
        chunk = rows[start:start + prompts_per_call]
        seeds = [derive_seed(seed, EVAL_SEED_SALT, start + i) for i in range(len(chunk))]
        rollout = policy.rollout(chunk, group_size, seeds, greedy=greedy)
        rollout.add_data_columns(chunk)
        _, rewards, _ = score_rollout(reward_fns, rollout, counts)
        totals += combined_total(rewards, dict(weights), combine, dict(gates or {})).tolist()
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
             prompts_per_call: int = 16, combine: str = "sum",
             gates: Mapping[str, float] | None = None) -> dict[str, float]:
    if not rows:
        raise ValueError("evaluation needs held-out rows (data.eval_path or a data set with an eval split)")
    sampled = _score(policy, rows, reward_fns, weights, group_size, seed, False, prompts_per_call, combine, gates)
    greedy = _score(policy, rows, reward_fns, weights, 1, seed, True, prompts_per_call, combine, gates)
    out = dict(sampled)
    out["greedy_reward_mean"] = greedy.pop("reward_mean")
    greedy.pop("reward_mean_se")
    out.update({k.replace("reward/", "greedy/"): v for k, v in greedy.items()})
    return out


def _eval_config(args, checkpoint: Path | None):
    """The run's own ``config.json`` (with the overrides) when the checkpoint belongs to a run, else the recipe."""
    from .cli import resolve_recipe
    from .config import load_recipe, parse_config
    recipe = [a for a in args.args if "=" not in a]
    overrides = [a for a in args.args if "=" in a]
    if len(recipe) > 1:
        raise UserError(f"mmrl eval takes one recipe, got {recipe}")
    if checkpoint is not None and (checkpoint.parent.parent / "config.json").is_file():
        return parse_config(json.loads((checkpoint.parent.parent / "config.json").read_text()), overrides)
    if not recipe:
        raise UserError("mmrl eval needs a recipe, or --checkpoint DIR of a run (its config.json is used)")
    cfg = load_recipe(resolve_recipe(recipe[0]), overrides)
    run_config = Path(cfg.output_dir) / "config.json"
    if checkpoint is None and run_config.is_file():  # the run as it was trained (LoRA rank, model, ...)
        return parse_config(json.loads(run_config.read_text()), overrides)
    return cfg


def run_eval(args) -> int:
    """`mmrl eval [RECIPE] [--checkpoint DIR] [--base] [key=value ...]`: print the scores as JSON and
    write them to ``CHECKPOINT.eval.json`` (``OUTPUT_DIR/base.eval.json`` with --base)."""
    from . import checkpoint as ckpt
    from .trainer import Trainer
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    if checkpoint is not None and not (checkpoint / ckpt.STATE).is_file():
        raise UserError(f"--checkpoint {args.checkpoint!r} is not a checkpoint directory (no {ckpt.STATE})")
    cfg = _eval_config(args, checkpoint)
    if checkpoint is None:
        checkpoint = ckpt.latest_checkpoint(cfg.output_dir, warn=lambda m: print(m, file=sys.stderr))
    if checkpoint is None and not args.base:
        raise UserError(f"output_dir {cfg.output_dir!r} has no checkpoint to score; pass --checkpoint DIR, "
                        "or --base to score the untrained model")
    if checkpoint is not None:
        problem = ckpt.verify(checkpoint)
        if problem is not None:
            raise UserError(f"checkpoint {checkpoint} is damaged: {problem}")
    trainer = Trainer(cfg, for_training=False)
    if checkpoint is not None:
        trainer.load_checkpoint(checkpoint)
    result = trainer.evaluate()
    result["checkpoint"] = str(checkpoint) if checkpoint else None
    if trainer.accelerator.is_main_process:
        out = (checkpoint.parent / f"{checkpoint.name}.eval.json" if checkpoint
               else Path(cfg.output_dir) / "base.eval.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
    return 0
