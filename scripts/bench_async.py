"""Asynchronous against synchronous rollouts (docs/async.md): the text demo's recipe, after its
warm start, trained for --steps steps with `rollout.mode: sync`, `one_step_off` (max_staleness 1) and
`async` at max_staleness 1 and 2, the trainer with one torch thread and the rollout worker with its
own; after --warmup steps, each run's trained samples / s and rollout tokens / s from the steps' own
times (`time_step_s`), and its `samples_per_s_ratio` = its samples / s over sync's. Each run is made
in this process, one after the other. `generate_share` is the share of a step spent waiting for
the rollouts (generating them, in `sync`); sync's `overlap_bound` = 1 / max(share, 1 - share) is
the most any overlap of generation with the rest of the step can give."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from bench_report import emit

RUNS = {"sync": ("sync", 0), "one_step_off": ("one_step_off", 1), "async_1": ("async", 1),
        "async_2": ("async", 2)}  # name: (rollout.mode, rollout.max_staleness)


def run_mode(name: str, args: argparse.Namespace, folder: Path) -> dict:
    """One run of RUNS; its throughput over the steps after the warm-up."""
    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES, load_plugins
    from mmrl.train.trainer import Trainer
    load_plugins()
    out, (mode, staleness) = folder / name, RUNS[name]
    cfg = load_recipe(RECIPES.get("text_demo"), [
        f"output_dir={out}", f"max_steps={args.steps}", f"rollout.mode={mode}", f"rollout.max_staleness={staleness}",
        "algorithm.rollout_correction=tis", f"optim.prompts_per_step={args.prompts}",
        f"policy.max_new_tokens={args.tokens}", f"policy.tiny_args.hidden={args.hidden}",
        f"policy.tiny_args.layers={args.layers}", f"warm_start.steps={args.warm_start_steps}",
        "eval.every=0", "save_every=0", "logging.report_to=[none]",
        "logging.progress=false", "logging.print_every=0"])
    trainer = Trainer(cfg)
    trainer.warm_start()  # the recipe's supervised warm start (untimed): its rewards vary within groups, so every step trains
    trainer.train()
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][args.warmup:]
    seconds = sum(s["time_step_s"] for s in steps)
    rows = args.prompts * cfg.algorithm.group_size
    generate = sum(s["time_generate_s"] for s in steps)
    return {"steps": len(steps), "seconds": seconds, "generate_share": generate / seconds,
            "samples_per_s": rows * len(steps) / seconds,
            "rollout_tokens_per_s": sum(s["completion_length"] * rows for s in steps) / seconds,
            "staleness_mean": sum(s["rollout/staleness_mean"] for s in steps) / len(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the times")
    parser.add_argument("--prompts", type=int, default=16, help="prompt groups per step")
    parser.add_argument("--tokens", type=int, default=24, help="policy.max_new_tokens")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--warm-start-steps", type=int, default=100,
                        help="the recipe's supervised warm start (default its 100 steps): from the random model "
                             "every reward is 0, no group varies and no step would train")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error(f"--steps {args.steps} must be more than --warmup {args.warmup}")
    import torch
    torch.set_num_threads(1)  # the trainer's one core; the worker sets its own
    with tempfile.TemporaryDirectory() as folder:
        report = {name: run_mode(name, args, Path(folder)) for name in RUNS}
    for name in RUNS:
        report[name]["samples_per_s_ratio"] = report[name]["samples_per_s"] / report["sync"]["samples_per_s"]
    # with generation overlapped whole, a step takes the longer of generation and the rest
    share = report["sync"]["generate_share"]
    report["sync"]["overlap_bound"] = 1 / max(share, 1 - share)
    emit(report, args.json)


if __name__ == "__main__":
    main()
