"""Prefix sharing (tasks/lm/prefix_sharing.py) against the plain log-prob forward, in one run.

One group of G completions of C tokens after a P-token prompt on the tiny Qwen2 (hidden 128,
2 layers): the training pass's forward + backward through `CausalLMPolicy.logprobs` with
`policy.prefix_sharing` on and off. Times are medians over `--repeats` runs, the two variants
alternating; peak memory is the most bytes the pass holds at once beyond what existed before it
(CUDA: `max_memory_allocated`; CPU: the profiler's allocation events replayed in order).
A sweep over shorter prompts shows where sharing starts to pay (the `auto` threshold), and the
same comparison with a 32k-token vocabulary (`large_vocab`) shows the part sharing cannot remove:
the output layer and log-softmax over the completion tokens, which on a 2-layer, 128-wide model
cost ten times the transformer layers per token (on a 7B model about a tenth).

Then one whole GRPO step of mmrl as a user runs it (`policy.prefix_sharing: auto`, shared
prefill on, micro-batches of whole groups) against TRL's `GRPOTrainer`, 2 CPU threads: with a
512-token text prompt on the same tiny Qwen2 (bench_engine.py's contenders, prompts lengthened)
and with a tiny Qwen2.5-VL at 256 visual tokens (bench_vlm.py's contenders, mmrl's
shared-prefill steps). Each trainer's step time is taken relative to bare steps interleaved in
its own process (bench_harness.py).

    python scripts/bench_prefix.py --json scripts/results/bench_prefix.json

prints and writes {"time_ratio": shared / plain, "memory_ratio": shared / plain,
"trl_time_ratio_long_prefix": mmrl / TRL, "trl_time_ratio_vlm": mmrl / TRL, ...}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_harness import compare as compare_steps  # noqa: E402
from bench_harness import over_bare, require_trl
from memory_probe import peak_bytes
from bench_report import emit  # noqa: E402
from bench_vlm import SIZE, split_of, visual_tokens  # noqa: E402
from mmrl.tasks.demos.tiny_models import seeded_model  # noqa: E402
from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy  # noqa: E402
from mmrl.tasks.lm.prefix_sharing import completion_lengths, prompt_groups, token_counts  # noqa: E402

from mmrl.core.rollout import Rollout  # noqa: E402


def group_batch(policy: CausalLMPolicy, prefix: int, group: int, completion: int, seed: int = 0) -> Rollout:
    """One prompt of `prefix` random tokens with `group` random completions of `completion` tokens."""
    g = torch.Generator().manual_seed(seed)
    low, high = 3, len(policy.tokenizer)  # past the char tokenizer's pad / eos / unk
    prompt = torch.randint(low, high, (1, prefix), generator=g).repeat(group, 1)
    completions = torch.randint(low, high, (group, completion), generator=g)
    return Rollout(group_id=torch.zeros(group, dtype=torch.long), prompts=[""] * group, completions=[""] * group,
                   unit_mask=torch.ones(group, completion),
                   extras={"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completions})


def train_pass(policy: CausalLMPolicy, batch: Rollout, advantages: Tensor) -> None:
    logp, _ = policy.logprobs(policy.model, batch)
    (-(logp * advantages[:, None]).sum() / batch.unit_mask.sum()).backward()
    policy.model.zero_grad(set_to_none=True)


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(policies: dict[str, CausalLMPolicy], prefix: int, group: int, completion: int, repeats: int,
            memory: bool) -> dict:
    batch = group_batch(policies["plain"], prefix, group, completion)
    advantages = torch.linspace(-1, 1, group)
    lengths = completion_lengths(batch.unit_mask)
    plain_tokens, shared_tokens = token_counts(batch.extras["prompt_mask"], lengths,
                                               prompt_groups(batch.group_id, batch.extras["prompt_ids"]))
    times: dict[str, list[float]] = {"plain": [], "shared": []}
    for policy in policies.values():  # warm-up
        train_pass(policy, batch, advantages)
    for _ in range(repeats):
        for name, policy in policies.items():
            times[name].append(seconds(lambda: train_pass(policy, batch, advantages)))  # noqa: B023 (called at once)
    out = {"prefix": prefix, "token_ratio": round(shared_tokens / plain_tokens, 4)}
    med = {k: statistics.median(v) for k, v in times.items()}
    out.update({"plain_s": round(med["plain"], 5), "shared_s": round(med["shared"], 5),
                "time_ratio": round(med["shared"] / med["plain"], 4)})
    if memory:
        peaks = {k: peak_bytes(lambda: train_pass(p, batch, advantages)) for k, p in policies.items()}  # noqa: B023
        out.update({"plain_peak_mb": round(peaks["plain"] / 2**20, 2),
                    "shared_peak_mb": round(peaks["shared"] / 2**20, 2),
                    "memory_ratio": round(peaks["shared"] / peaks["plain"], 4)})
    return out


def with_vocabulary(policies: dict[str, CausalLMPolicy], size: int) -> dict[str, CausalLMPolicy]:
    """The same policies sharing one tiny Qwen2 whose output layer spans `size` tokens."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    plain = policies["plain"]
    config = Qwen2Config(**{**plain.model.config.to_dict(), "vocab_size": size})
    model = seeded_model(Qwen2ForCausalLM, config, plain.tokenizer, 0).to(plain.device)
    for policy in policies.values():
        policy.model = model
    return policies


def trl_step(script: str, options: dict, rounds: int, shared_only: bool) -> dict:
    """mmrl / TRL step time, each over the bare steps interleaved beside it, from `script`'s
    mmrl and trl workers (`shared_only`: bench_vlm's mmrl steps with the shared prefill); the
    median over rounds of fresh processes, with each round's."""
    measured = compare_steps(script, options, options["threads"], rounds, ("mmrl", "trl"), ())

    def kept(run: dict[str, dict[str, list]], name: str) -> tuple[list[float], dict[str, float]]:
        if not shared_only:
            return run[name]["times"], {}
        # bench_vlm's workers also report each step's rollout / log-prob / update time
        return split_of(run[name]["times"], run[name]["extra"], lambda e: name == "trl" or e["shared_prefill"])

    def ratio(run: dict[str, dict[str, list]]) -> float:
        return over_bare(kept(run, "mmrl")[0], run["mmrl"]["floor"]) / over_bare(kept(run, "trl")[0], run["trl"]["floor"])

    pooled = {name: {k: measured.pooled(k)[name] for k in ("times", "floor", "extra")} for name in ("mmrl", "trl")}
    times, split = {}, {}
    for name in pooled:
        times[name], split[name] = kept(pooled, name)
    floor = {name: pooled[name]["floor"] for name in pooled}
    over = {name: over_bare(times[name], floor[name]) for name in times}
    runs = measured.per_round(ratio)
    return {"trl_time_ratio": round(runs["median"], 4), "runs": runs,
            **({"split_s": {n: {p: round(t, 4) for p, t in v.items()} for n, v in split.items()}} if shared_only else {}),
            "over_bare": {name: round(v, 4) for name, v in over.items()},
            "median_step_s": {name: round(statistics.median(v), 4) for name, v in times.items()},
            "median_bare_step_s": {name: round(statistics.median(v), 4) for name, v in floor.items()},
            "timed_steps": {name: len(v) for name, v in times.items()}, "load_average": measured.load_average,
            **options}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--prefix", type=int, default=1024, help="prompt tokens (P)")
    parser.add_argument("--completion", type=int, default=64, help="tokens per completion (C)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per variant (the median is reported)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the log-prob passes")
    parser.add_argument("--large-vocab", type=int, default=32000, help="vocabulary of the large_vocab comparison")
    parser.add_argument("--sweep", type=int, nargs="*", default=[8, 16, 32, 64, 128, 256],
                        help="shorter prompt lengths timed too (where the auto threshold comes from)")
    parser.add_argument("--trl", action=argparse.BooleanOptionalAction, default=True,
                        help="also time whole GRPO steps against TRL (needs trl: pip install -e '.[bench]')")
    parser.add_argument("--trl-steps", type=int, default=6,
                        help="timed steps per trainer process (at least 2: bench_vlm's mmrl steps alternate "
                             "shared and plain prefill)")
    parser.add_argument("--trl-rounds", type=int, default=3,
                        help="rounds of fresh trainer processes (the median and range over them are reported)")
    parser.add_argument("--trl-threads", type=int, default=2, help="CPU threads of the trainer processes")
    args = parser.parse_args()
    if args.trl and args.trl_steps < 2:
        parser.error(f"--trl-steps {args.trl_steps}: at least 2 (bench_vlm's mmrl steps alternate shared and plain)")
    require_trl(args.trl)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    device = "cuda" if torch.cuda.is_available() else None
    policies = {name: CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", device=device,
                                                    prefix_sharing="on" if name == "shared" else "off"))
                for name in ("plain", "shared")}
    main_run = compare(policies, args.prefix, args.group, args.completion, args.repeats, memory=True)
    sweep = [compare(policies, p, args.group, args.completion, args.repeats, memory=False) for p in args.sweep]
    large_vocab = compare(with_vocabulary(policies, args.large_vocab), args.prefix, args.group, args.completion,
                          args.repeats, memory=True)
    steps = {"steps": args.trl_steps, "warmup": 1, "group": args.group, "prompts": 2, "tokens": 32,
             "threads": args.trl_threads}
    trl = {}
    if args.trl:
        here = Path(__file__).resolve().parent
        trl["long_prefix"] = trl_step(str(here / "bench_engine.py"),
                                      {**steps, "prompt_tokens": 512, "hidden": 128, "layers": 2},
                                      args.trl_rounds, shared_only=False)
        trl["vlm"] = {"visual_tokens_per_image": visual_tokens(SIZE),
                      **trl_step(str(here / "bench_vlm.py"), steps,
                                 args.trl_rounds, shared_only=True)}
    emit({"time_ratio": main_run["time_ratio"], "memory_ratio": main_run["memory_ratio"],
          **{f"trl_time_ratio_{k}": v["trl_time_ratio"] for k, v in trl.items()},
          "group": args.group, "completion": args.completion, **main_run, "threads": args.threads,
          "load_average_1min": [round(load, 2), round(os.getloadavg()[0], 2)], "device": device or "cpu",
          "model": "tiny:qwen2-char (hidden 128, 2 layers, 99-token vocabulary)", "sweep": sweep,
          "large_vocab": {"vocab_size": args.large_vocab, **large_vocab},
          **({"trl_step": trl, "load_average_1min_end": round(os.getloadavg()[0], 2)} if trl else {})}, args.json)


if __name__ == "__main__":
    main()
