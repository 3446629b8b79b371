"""Embedded demos: warm start, held-out score, RL, held-out score, ``summary.json``.

Every demo writes the same summary shape:
``{"metric": ..., "before": x, "after": y, "greedy_before": ..., "greedy_after": ...}``, where
the metric is the mean reward of `eval.group_size` samples per held-out prompt at the rollout
temperature, the quantity RL optimises.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from .config import load_recipe
from .errors import reading_user_input
from .registry import DEMO_FIGURES, DEMOS, RECIPES
from .trainer import Trainer

FIGURE_ROWS = 8


def _json(value) -> str:
    """Completions that are not JSON (images, audio) are written as their type's name."""
    return json.dumps(value, indent=1, default=lambda o: f"<{type(o).__name__}>")


def _greedy_completions(trainer: Trainer) -> list:
    rows = trainer.eval_rows[:FIGURE_ROWS]
    return trainer.policy.rollout(rows, 1, [0] * len(rows), greedy=True).completions


def run_demo_command(args) -> int:
    """`mmrl demo NAME [key=value ...]`."""
    run_demo(args.name, args.overrides)
    return 0


def run_demo(name: str, overrides: list[str]) -> dict:
    with reading_user_input():
        recipe = RECIPES.get(DEMOS.get(name))
    return run_scored(recipe, overrides, name)


def run_scored(recipe: str | Path, overrides: list[str], name: str,
               warm_start: Callable[[Trainer], object] | None = None) -> dict:
    """Warm start (`warm_start(trainer)`, default `Trainer.warm_start`), held-out score, RL,
    held-out score, ``summary.json`` for any recipe; demo `name`'s samples figure when it has one."""
    cfg = load_recipe(recipe, overrides)
    trainer = Trainer(cfg)
    out = Path(cfg.output_dir)
    before_path = out / "before.json"
    say = print if trainer.accelerator.is_main_process else (lambda *a, **k: None)
    t0 = time.perf_counter()
    if trainer.resumed and before_path.is_file():
        before = json.loads(before_path.read_text())
    else:
        (warm_start or Trainer.warm_start)(trainer)
        before = trainer.evaluate()
        before["greedy_samples"] = _greedy_completions(trainer)
        if trainer.accelerator.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            before_path.write_text(_json(before))
    say(f"[mmrl demo {name}] before RL: sampled reward {before['reward_mean']:.3f}, "
        f"greedy {before['greedy_reward_mean']:.3f}")
    trainer.train()
    after = trainer.evaluate()
    after["greedy_samples"] = _greedy_completions(trainer)
    if name in DEMO_FIGURES and trainer.accelerator.is_main_process:
        figure = out / "plots" / "samples.png"
        DEMO_FIGURES.get(name)(trainer.eval_rows[:FIGURE_ROWS], before["greedy_samples"],
                               after["greedy_samples"], figure)
        say(f"[mmrl demo {name}] wrote {figure}")
    say(f"[mmrl demo {name}] after RL:  sampled reward {after['reward_mean']:.3f}, "
        f"greedy {after['greedy_reward_mean']:.3f}")
    summary = {
        "metric": f"mean reward of {cfg.eval.group_size} samples per held-out prompt "
                  f"(n={min(len(trainer.eval_rows), cfg.eval.max_prompts)}) at the rollout temperature",
        "before": before["reward_mean"], "after": after["reward_mean"],
        "before_se": before["reward_mean_se"], "after_se": after["reward_mean_se"],
        "greedy_before": before["greedy_reward_mean"], "greedy_after": after["greedy_reward_mean"],
        "before_detail": before, "after_detail": after,
        "rl_steps": cfg.max_steps, "wall_s": time.perf_counter() - t0,
    }
    if trainer.accelerator.is_main_process:
        (out / "summary.json").write_text(_json(summary))
        say(f"[mmrl demo {name}] wrote {out / 'summary.json'}")
    return summary
