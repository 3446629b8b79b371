"""Asynchronous against synchronous rollouts (docs/async.md): the text demo's recipe, after its
warm start, trained for --steps steps with `rollout.mode: sync`, `one_step_off` (max_staleness 1) and
`async` at max_staleness 1 and 2, the trainer with one torch thread and the rollout worker with its
own; after --warmup steps, each run's trained samples / s and rollout tokens / s from the steps' own
times (`time_step_s`), and its `samples_per_s_ratio` = its samples / s over sync's. Each run is made
in this process, one after the other. `generate_share` is the share of a step spent waiting for
the rollouts (generating them, in `sync`); sync's `overlap_bound` = 1 / max(share, 1 - share) is
the most any overlap of generation with the rest of the step can give.

With --served-latency S, instead: the recipe's rewards plus one behind a real `mmrl serve-reward`
that waits S seconds per request of 32 rows (scripts/bench_slow_reward.py, weight 0: scored, not
trained on; client batch 32, concurrency 2), and the runs `sync`, `async_1_trainer_scored` (the
trainer scores each step's rollouts when it collects them: `scoring.where: trainer`) and
`async_1_worker_scored` (the worker scores each generation call in a thread while it generates the
next: `scoring.where: worker`), each with its `reward_share` (the share of a step spent scoring in
the trainer) beside the throughput; sync's `overlap_bound` then counts generation and scoring
together against the rest of the step (what the worker can take over).

    python scripts/bench_async.py --served-latency 0.2 --json bench_async_served.json"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from bench_report import emit

RUNS = {"sync": ("sync", 0, "auto"), "one_step_off": ("one_step_off", 1, "auto"), "async_1": ("async", 1, "auto"),
        "async_2": ("async", 2, "auto")}  # name: (rollout.mode, rollout.max_staleness, scoring.where)
SERVED_RUNS = {"sync": ("sync", 0, "auto"), "async_1_trainer_scored": ("async", 1, "trainer"),
               "async_1_worker_scored": ("async", 1, "worker")}
REQUEST_ROWS = 32  # --served-latency: rows per request, the client's batch and the server's
SLOW_REWARD = Path(__file__).with_name("bench_slow_reward.py")


def served_reward(url: str) -> list[str]:
    """The overrides that add the slow served reward (weight 0) to the recipe's."""
    key = "rewards.slow_digit_share"
    return [f"reward_modules=[{SLOW_REWARD}]", f"{key}.weight=0.0", f"{key}.url={url}",
            f"{key}.client.batch_size={REQUEST_ROWS}", f"{key}.client.concurrency=2", f"{key}.client.cache=false"]


def run_mode(name: str, setting: tuple[str, int, str], args: argparse.Namespace, folder: Path,
             extra: list[str]) -> dict:
    """One run; its throughput over the steps after the warm-up."""
    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES, load_plugins
    from mmrl.train.loop.trainer import Trainer
    load_plugins()
    out, (mode, staleness, where) = folder / name, setting
    cfg = load_recipe(RECIPES.get("text_demo"), [
        f"output_dir={out}", f"max_steps={args.steps}", f"rollout.mode={mode}", f"rollout.max_staleness={staleness}",
        f"scoring.where={where}", *extra,
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
            "reward_share": sum(s["time_reward_s"] for s in steps) / seconds,
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
    parser.add_argument("--served-latency", type=float, default=0.0,
                        help="seconds per request of a served reward added to the recipe's (above); 0: none")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error(f"--steps {args.steps} must be more than --warmup {args.warmup}")
    import torch
    torch.set_num_threads(1)  # the trainer's one core; the worker sets its own
    with tempfile.TemporaryDirectory() as folder:
        if args.served_latency > 0:
            report = served_runs(args, Path(folder))
        else:
            report = {name: run_mode(name, setting, args, Path(folder), []) for name, setting in RUNS.items()}
    for name in report:
        report[name]["samples_per_s_ratio"] = report[name]["samples_per_s"] / report["sync"]["samples_per_s"]
    # with generation (and, served, the worker's scoring) overlapped whole, a step takes the longer of it and the rest
    share = report["sync"]["generate_share"] + (report["sync"]["reward_share"] if args.served_latency > 0 else 0.0)
    report["sync"]["overlap_bound"] = 1 / max(share, 1 - share)
    emit(report, args.json)


def served_runs(args: argparse.Namespace, folder: Path) -> dict:
    """SERVED_RUNS with the slow reward behind `mmrl serve-reward` in a subprocess."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from served import free_port, running
    port = free_port()
    command = [sys.executable, "-m", "mmrl", "serve-reward", "slow_digit_share", "--reward-module", str(SLOW_REWARD),
               "--port", str(port), "--batch-size", str(REQUEST_ROWS), f"latency={args.served_latency}",
               f"request_rows={REQUEST_ROWS}"]
    with running(command, port) as (url, _):
        return {name: {**run_mode(name, setting, args, folder, served_reward(url)), "served_latency_s": args.served_latency}
                for name, setting in SERVED_RUNS.items()}


if __name__ == "__main__":
    main()
