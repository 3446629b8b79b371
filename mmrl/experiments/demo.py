"""Embedded demos: warm start, held-out score, RL, held-out score, ``summary.json``.

Every demo writes the same summary shape:
``{"metric": ..., "before": x, "after": y, "greedy_before": ..., "greedy_after": ...}``, where
the metric is the mean reward of `eval.group_size` samples per held-out prompt at the rollout
temperature, the quantity RL optimises. A demo with a held-out evaluator
(`mmrl.registry.DEMO_EVALUATORS`, never a training reward) adds ``evaluator`` (its name),
``eval_before`` / ``eval_after`` (on the same samples), ``greedy_eval_before`` /
``greedy_eval_after`` and, per extra metric it reports, ``eval_before/<metric>`` /
``eval_after/<metric>``. The held-out inputs and outputs are written to
``OUTPUT_DIR/samples/before/`` and ``samples/after/`` (by the demo's
`mmrl.registry.DEMO_SAMPLE_WRITERS` entry: images as PNG; else ``samples.json``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from mmrl.config.parse import load_recipe
from mmrl.errors import reading_user_input
from mmrl.registry import DEMO_EVALUATORS, DEMO_FIGURES, DEMO_SAMPLE_WRITERS, DEMOS, RECIPES
from mmrl.train.loop.trainer import Trainer

FIGURE_ROWS = 8


def _json(value) -> str:
    """Completions that are not JSON (images, audio) are written as their type's name."""
    return json.dumps(value, indent=1, default=lambda o: f"<{type(o).__name__}>")


def _figure_sample(sample: dict):
    """The greedy completion a demo figure draws; an episode's as {"text", "tool_calls"}."""
    calls = sample["greedy_columns"].get("tool_calls")
    return sample["greedy"] if calls is None else {"text": sample["greedy"], "tool_calls": calls[0]}


def _scored(trainer: Trainer, name: str, folder: Path) -> dict:
    """Held-out scores with the demo's evaluator, the scored samples written to `folder`, and
    the greedy completions of the figure's rows (``greedy_samples``)."""
    evaluator = DEMO_EVALUATORS.get(name) if name in DEMO_EVALUATORS else None
    scores = trainer.evaluate(evaluator=evaluator, keep_samples=True)
    samples = scores.pop("samples")
    scores["greedy_samples"] = [_figure_sample(s) for s in samples[:FIGURE_ROWS]]  # the evaluation's own greedy pass
    if trainer.accelerator.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        if name in DEMO_SAMPLE_WRITERS:
            DEMO_SAMPLE_WRITERS.get(name)(samples, folder)
        else:
            (folder / "samples.json").write_text(_json(samples))
    return scores


def _evaluator_summary(name: str, before: dict, after: dict) -> dict:
    if "eval_mean" not in before or "eval_mean" not in after:
        return {}
    out = {"evaluator": DEMO_EVALUATORS.get(name).name,
           "eval_before": before["eval_mean"], "eval_after": after["eval_mean"],
           "eval_before_se": before["eval_mean_se"], "eval_after_se": after["eval_mean_se"],
           "greedy_eval_before": before["greedy_eval_mean"], "greedy_eval_after": after["greedy_eval_mean"]}
    for key in after:
        if key.startswith(("eval_mean/", "greedy_eval_mean/", "eval/", "greedy_eval/")) and key in before:
            metric = key.replace("eval_mean/", "eval/").replace("greedy_eval_mean/", "greedy_eval/")
            head, _, tail = metric.partition("/")
            out[f"{head}_before/{tail}"], out[f"{head}_after/{tail}"] = before[key], after[key]
    return out


def run_demo(name: str, overrides: list[str]) -> dict:
    with reading_user_input():
        recipe = RECIPES.get(DEMOS.get(name))
    return run_scored(recipe, overrides, name)


def run_scored(recipe: str | Path, overrides: list[str], name: str,
               warm_start: Callable[[Trainer], object] | None = None) -> dict:
    """Warm start (`warm_start(trainer)`, default `Trainer.warm_start`), held-out score, RL,
    held-out score, ``summary.json`` for any recipe; demo `name`'s samples figure when it has one."""
    cfg = load_recipe(recipe, overrides)
    # the periodic evaluations (eval.every) score the demo's judge too: proxy against gold
    trainer = Trainer(cfg, held_out_evaluator=DEMO_EVALUATORS.get(name) if name in DEMO_EVALUATORS else None,
                      needs_held_out=True)
    out = Path(cfg.output_dir)
    before_path = out / "before.json"
    say = print if trainer.accelerator.is_main_process else (lambda *a, **k: None)
    t0 = time.perf_counter()
    if trainer.resumed and before_path.is_file():
        before = json.loads(before_path.read_text())
    else:
        (warm_start or Trainer.warm_start)(trainer)
        before = _scored(trainer, name, out / "samples" / "before")
        if trainer.accelerator.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            before_path.write_text(_json(before))
    say(f"[mmrl demo {name}] before RL: sampled reward {before['reward_mean']:.3f}, "
        f"greedy {before['greedy_reward_mean']:.3f}")
    trainer.train()
    after = _scored(trainer, name, out / "samples" / "after")
    if name in DEMO_FIGURES and trainer.accelerator.is_main_process:
        figure = out / "plots" / "samples.png"
        DEMO_FIGURES.get(name)(trainer.inputs.eval_rows[:len(after["greedy_samples"])], before["greedy_samples"],
                               after["greedy_samples"], figure)
        say(f"[mmrl demo {name}] wrote {figure}")
    say(f"[mmrl demo {name}] after RL:  sampled reward {after['reward_mean']:.3f}, "
        f"greedy {after['greedy_reward_mean']:.3f}")
    judged = _evaluator_summary(name, before, after)
    if judged:
        say(f"[mmrl demo {name}] evaluator ({judged['evaluator']}): {judged['eval_before']:.3f} -> "
            f"{judged['eval_after']:.3f}, greedy {judged['greedy_eval_before']:.3f} -> {judged['greedy_eval_after']:.3f}")
    summary = {
        "metric": f"mean reward of {cfg.eval.group_size} samples per held-out prompt "
                  f"(n={min(len(trainer.inputs.eval_rows), cfg.eval.max_prompts)}) at the rollout temperature",
        "before": before["reward_mean"], "after": after["reward_mean"],
        "before_se": before["reward_mean_se"], "after_se": after["reward_mean_se"],
        "greedy_before": before["greedy_reward_mean"], "greedy_after": after["greedy_reward_mean"],
        **judged,
        "before_detail": before, "after_detail": after,
        "rl_steps": cfg.max_steps, "wall_s": time.perf_counter() - t0,
    }
    if trainer.accelerator.is_main_process:
        (out / "summary.json").write_text(_json(summary))
        say(f"[mmrl demo {name}] wrote {out / 'summary.json'}")
    return summary
