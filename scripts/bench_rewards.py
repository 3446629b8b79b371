"""Reward throughput on a batch of 64: WER scores per second and LaTeX renders per second, the
serial path (one pair / one compile at a time) against the batched / parallel path the rewards
use (one jiwer alignment call for the batch; sandboxed compiles on a thread pool).

    python scripts/bench_rewards.py --json bench_rewards.json

With --overlap, instead: the step time of the text demo's model trained with a reward that waits
`--latency` seconds per request of `--request-rows` rows (time.sleep, which releases the GIL as a
network request does), scored after the whole rollout (mmrl's serial path: one generation call)
against scored while the next groups generate (`scoring.overlap`, `--groups-per-call` groups per
generation call); steps alternate between the two trainers, medians over `--steps` steps.

    python scripts/bench_rewards.py --overlap --json bench_overlap.json
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

from bench_report import emit

WORDS = "the a cat dog sat on mat blue red went home fast slow over under river bank".split()


def rate(fn, n: int, repeats: int) -> float:
    """Items per second, best of `repeats` (the least disturbed run)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def waiting_reward(latency: float, request_rows: int):
    """A reward that waits `latency` s per request of `request_rows` rows, then scores the digit share."""
    def wait_then_score(prompts, completions, **columns) -> list[float]:
        time.sleep(latency * math.ceil(len(completions) / request_rows))
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
    return wait_then_score


def overlap_report(args) -> dict:
    """Median step time (and its generate / reward phases) of each mode, and their ratio."""
    import tempfile

    import torch

    from mmrl.config.parse import load_recipe
    from mmrl.config.recipes import resolve_recipe
    from mmrl.core.scoring import REWARDS, register_reward
    from mmrl.train.trainer import Trainer
    torch.set_num_threads(args.threads)
    if "bench_waiting_reward" not in REWARDS:
        register_reward("bench_waiting_reward")(waiting_reward(args.latency, args.request_rows))
    modes = {"serial": ["scoring.overlap=false", "scoring.groups_per_call=0"],
             "overlapped": ["scoring.overlap=true", f"scoring.groups_per_call={args.groups_per_call}"]}
    trainers = {mode: Trainer(load_recipe(resolve_recipe("text_demo"), [
        f"output_dir={tempfile.mkdtemp(prefix='mmrl-bench-overlap-')}", "rewards={bench_waiting_reward: {}}",
        f"optim.prompts_per_step={args.prompts}", f"algorithm.group_size={args.group}",
        f"optim.micro_batch_size={args.prompts * args.group}", "logging.report_to=[none]", "logging.progress=false",
        *extra])) for mode, extra in modes.items()}
    steps: dict[str, list[dict]] = {mode: [] for mode in modes}
    for k in range(args.warmup + args.steps):
        for mode, trainer in trainers.items():
            metrics = trainer.train_step()
            if k >= args.warmup:
                steps[mode].append(metrics)
    report = {mode: {key: statistics.median(m[key] for m in runs)
                     for key in ("time_step_s", "time_generate_s", "time_reward_s")} for mode, runs in steps.items()}
    report["overlap_step_time_ratio"] = report["overlapped"]["time_step_s"] / report["serial"]["time_step_s"]
    report["setup"] = {k: getattr(args, k) for k in ("latency", "request_rows", "groups_per_call", "prompts", "group",
                                                     "steps", "warmup", "threads")}
    report["setup"]["model"] = "text_demo (tiny:qwen2-char, hidden 128, 2 layers, 24 new tokens)"
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overlap", action="store_true", help="measure scoring.overlap instead (see above)")
    parser.add_argument("--latency", type=float, default=0.2, help="--overlap: seconds the reward waits per request")
    parser.add_argument("--request-rows", type=int, default=32, help="--overlap: rows per request")
    parser.add_argument("--groups-per-call", type=int, default=4, help="--overlap: groups per generation call")
    parser.add_argument("--prompts", type=int, default=16, help="--overlap: prompt groups per step")
    parser.add_argument("--group", type=int, default=8, help="--overlap: completions per prompt")
    parser.add_argument("--steps", type=int, default=3, help="--overlap: timed steps per mode")
    parser.add_argument("--warmup", type=int, default=1, help="--overlap: untimed steps per mode first")
    parser.add_argument("--threads", type=int, default=2, help="--overlap: torch threads")
    args = parser.parse_args()
    if args.overlap:
        emit(overlap_report(args), args.json)
        return
    from mmrl.rewards.latex_sandbox import compile_latex, tex_available
    from mmrl.rewards.wer import error_rates, word_error_rate

    rng = random.Random(0)
    refs = [" ".join(rng.choices(WORDS, k=rng.randint(5, 25))) for _ in range(args.batch)]
    hyps = [" ".join(w if rng.random() > 0.2 else rng.choice(WORDS) for w in r.split()) for r in refs]
    report = {
        "wer_serial_per_s": rate(lambda: [word_error_rate(r, h) for r, h in zip(refs, hyps)], args.batch, args.repeats),
        "wer_batched_per_s": rate(lambda: error_rates(refs, hyps), args.batch, args.repeats),
    }
    report["wer_speedup"] = report["wer_batched_per_s"] / report["wer_serial_per_s"]
    if tex_available():
        from concurrent.futures import ThreadPoolExecutor
        formulas = [rf"\frac{{a_{i}}}{{b+{i}}} + \sqrt{{x^{{{i % 7}}}}}" for i in range(args.batch)]

        def parallel():
            with ThreadPoolExecutor(args.workers) as pool:
                list(pool.map(compile_latex, formulas))

        report["latex_serial_per_s"] = rate(lambda: [compile_latex(f) for f in formulas], args.batch, 1)
        report["latex_parallel_per_s"] = rate(parallel, args.batch, 1)
        report["latex_speedup"] = report["latex_parallel_per_s"] / report["latex_serial_per_s"]
        report["latex_workers"] = args.workers
    report["batch"] = args.batch
    emit(report, args.json)


if __name__ == "__main__":
    main()
