"""Reward throughput on a batch of 64: WER scores per second and LaTeX renders per second, the
serial path (one pair / one compile at a time) against the batched / parallel path the rewards
use (one jiwer alignment call for the batch; sandboxed compiles on a thread pool).

    python scripts/bench_rewards.py --json bench_rewards.json
"""

from __future__ import annotations

import argparse
import random
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
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
