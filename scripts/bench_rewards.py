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

With --served, the same measurement with the reward served: `mmrl serve-reward slow_digit_share`
(scripts/bench_slow_reward.py, `--latency` seconds per request) in a subprocess, the trainers
scoring through `rewards.slow_digit_share.url`; and the same reward in process (waiting as long per
`--request-rows` rows) for comparison, with the requests per second each path answers in a burst.

    python scripts/bench_rewards.py --served --json bench_served.json

The settings are those a user would choose to hide a 200 ms-per-request server behind generation:
a request per generation call (`client.batch_size` = `--request-rows` = groups per call x group
size = 32 rows), since the server scores one request at a time and each request costs the latency
whatever its size, so fewer, larger requests cost least; concurrency 2, so the next call's request
is already queued when one finishes (more would only wait in the server's queue); `--groups-per-call`
4 of 16 groups, so scoring one call (one request, 0.2 s) takes no longer than generating the next
and all but the last call's scoring hides behind generation; 24 new tokens (the text demo's), long
enough that a call's generation is comparable to a request's latency.
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


def overlap_report(args, reward: str = "{bench_waiting_reward: {}}", modules: tuple[str, ...] = ()) -> dict:
    """Median step time (and its generate / reward phases) of each mode, and their ratio, scoring
    with the recipe's rewards section `reward` (from the reward modules `modules`)."""
    import tempfile

    import torch

    from mmrl.config.parse import load_recipe
    from mmrl.config.recipes import resolve_recipe
    from mmrl.core.scoring import REWARDS, register_reward
    from mmrl.train.loop.trainer import Trainer
    torch.set_num_threads(args.threads)
    if not modules and "bench_waiting_reward" not in REWARDS:
        register_reward("bench_waiting_reward")(waiting_reward(args.latency, args.request_rows))
    modes = {"serial": ["scoring.overlap=false", "scoring.groups_per_call=0"],
             "overlapped": ["scoring.overlap=true", f"scoring.groups_per_call={args.groups_per_call}"]}
    trainers = {mode: Trainer(load_recipe(resolve_recipe("text_demo"), [
        f"output_dir={tempfile.mkdtemp(prefix='mmrl-bench-overlap-')}", f"rewards={reward}",
        f"reward_modules=[{','.join(modules)}]",
        f"optim.prompts_per_step={args.prompts}", f"algorithm.group_size={args.group}",
        f"optim.micro_batch_size={args.prompts * args.group}", "logging.report_to=[none]", "logging.progress=false",
        f"policy.max_new_tokens={args.new_tokens}", f"policy.min_new_tokens={args.new_tokens}",
        f"policy.tiny_args={{hidden: {args.hidden}, layers: {args.layers}, heads: 4, seed: 0}}",
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
    report.update(overlap_bound(report["serial"], report["overlap_step_time_ratio"]))
    # what splitting the draw into calls costs: the bound assumes none (a call's cost linear in its rows)
    report["generation_split_cost"] = report["overlapped"]["time_generate_s"] / report["serial"]["time_generate_s"]
    report["setup"] = {k: getattr(args, k) for k in ("latency", "request_rows", "groups_per_call", "prompts", "group",
                                                     "steps", "warmup", "threads", "new_tokens")}
    report["setup"]["model"] = f"text_demo (tiny:qwen2-char, hidden {args.hidden}, {args.layers} layers)"
    return report


def overlap_bound(serial: dict, measured_ratio: float) -> dict:
    """The best an overlap can do from the serial step's phases: hide the shorter of generation and
    scoring entirely. `overlap_bound` is that step's time over the serial step's, `phase_balance` the
    shorter phase over the longer (1: they take as long), `ratio_to_bound` the measured ratio over the
    bound (1: the machinery hides all it can)."""
    generate, score, step = serial["time_generate_s"], serial["time_reward_s"], serial["time_step_s"]
    bound = (step - min(generate, score)) / step
    return {"overlap_bound": bound, "phase_balance": min(generate, score) / max(generate, score),
            "ratio_to_bound": measured_ratio / bound}


def served_report(args) -> dict:
    """The overlap measurement with the reward served and in process, and each path's requests per second."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from served import free_port, running

    module = str(Path(__file__).with_name("bench_slow_reward.py"))
    port = free_port()
    args_text = f"latency: {args.latency}, request_rows: {args.request_rows}"
    command = [sys.executable, "-m", "mmrl", "serve-reward", "slow_digit_share", "--reward-module", module,
               "--port", str(port), "--batch-size", str(args.request_rows), f"latency={args.latency}",
               f"request_rows={args.request_rows}"]
    client = f"{{batch_size: {args.request_rows}, concurrency: {args.concurrency}, cache: false}}"
    with running(command, port) as (url, _):
        served = overlap_report(args, f"{{slow_digit_share: {{url: '{url}', client: {client}}}}}", (module,))
        served_rps = requests_per_second(url, args)
    in_process = overlap_report(args, f"{{slow_digit_share: {{args: {{{args_text}}}}}}}", (module,))
    return {"overlap_step_time_ratio": served["overlap_step_time_ratio"],
            **{key: served[key] for key in ("overlap_bound", "phase_balance", "ratio_to_bound", "generation_split_cost")},
            "served": served,
            "in_process": in_process, "served_requests_per_s": served_rps,
            "in_process_requests_per_s": in_process_requests_per_second(args),
            "served_vs_in_process_step_time": served["overlapped"]["time_step_s"] / in_process["overlapped"]["time_step_s"],
            "setup": {**served["setup"], "concurrency": args.concurrency, "server": "mmrl serve-reward, one call at a time"}}


def requests_per_second(url: str, args) -> float:
    """Requests of `--request-rows` rows the server answers per second, 4 x concurrency sent at once."""
    from mmrl.config.remote import ClientSettings
    from mmrl.serving.transport import Transport
    transport = Transport([url], ClientSettings(concurrency=args.concurrency, cache=False))
    n = 4 * args.concurrency
    bodies = [{"prompts": ["p"] * args.request_rows, "completions": [f"{k} 1"] * args.request_rows, "columns": {},
               "args": {}} for k in range(n)]
    t0 = time.perf_counter()
    transport.send("/score", bodies)
    return n / (time.perf_counter() - t0)


def in_process_requests_per_second(args) -> float:
    """Calls of `--request-rows` rows the reward in process answers per second, one at a time."""
    from mmrl.core.scoring import get_reward
    reward = get_reward("slow_digit_share")
    n = 4 * args.concurrency
    t0 = time.perf_counter()
    for k in range(n):
        reward(["p"] * args.request_rows, [f"{k} 1"] * args.request_rows, latency=args.latency,
               request_rows=args.request_rows)
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overlap", action="store_true", help="measure scoring.overlap instead (see above)")
    parser.add_argument("--served", action="store_true", help="measure the overlap with the reward served (above)")
    parser.add_argument("--concurrency", type=int, default=2, help="--served: requests in flight at once")
    parser.add_argument("--latency", type=float, default=0.2, help="--overlap: seconds the reward waits per request")
    parser.add_argument("--request-rows", type=int, default=32, help="--overlap: rows per request")
    parser.add_argument("--groups-per-call", type=int, default=4, help="--overlap: groups per generation call")
    parser.add_argument("--prompts", type=int, default=16, help="--overlap: prompt groups per step")
    parser.add_argument("--group", type=int, default=8, help="--overlap: completions per prompt")
    parser.add_argument("--steps", type=int, default=3, help="--overlap: timed steps per mode")
    parser.add_argument("--warmup", type=int, default=1, help="--overlap: untimed steps per mode first")
    parser.add_argument("--threads", type=int, default=2, help="--overlap: torch threads")
    parser.add_argument("--new-tokens", type=int, default=24, help=(
        "--overlap: tokens of every completion (min = max new tokens; the text demo's 24 by default): "
        "the longer, the more generation there is to hide the reward's latency behind"))
    parser.add_argument("--hidden", type=int, default=128, help=(
        "--overlap: the tiny Qwen2's width (the text demo's 128): wider makes a generation call's cost "
        "grow with its rows, as a large policy's does, instead of a fixed cost per decoding step"))
    parser.add_argument("--layers", type=int, default=2, help="--overlap: the tiny Qwen2's layers (the text demo's 2)")
    args = parser.parse_args()
    if args.overlap or args.served:
        emit(served_report(args) if args.served else overlap_report(args), args.json)
        return
    from mmrl.rewards.latex_sandbox import compile_latex, tex_available
    from mmrl.rewards.error_rates import error_rates, word_error_rate

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
