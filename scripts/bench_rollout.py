"""Rollout throughput of the two engines of a causal LM (`policy.rollout_engine: hf | vllm`) and
the gap between vLLM's log-probs and the training forward's.

The same tiny random Qwen2 (head dim 64: vLLM's CPU attention rejects 16), the same prompts and
seeds, G completions per prompt, `--max-new-tokens` each. Reported per engine: completion tokens
per second (real tokens, EOS included, over the wall time of the rollout call, the median of
`--repeats` timed calls after one untimed warm-up that also builds vLLM's engine) and, for vLLM,
``logp_diff_max`` / ``logp_diff_mean``: |vLLM's sampler log-prob - the training forward's| over
every real completion token, fp32 (goal <= 1e-3). ``vllm_vs_hf_tokens_per_s`` is the ratio of the
two throughputs. Run it in the venv of scripts/make_vllm_env.sh:

    DIR/bin/python scripts/bench_rollout.py --json scripts/results/bench_rollout.json

On a GPU, `--device cuda --hidden 896 --layers 24 --heads 14` gives a Qwen2.5-0.5B-sized random model.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's mmrl / tasks

import torch  # noqa: E402

from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy  # noqa: E402

PROMPTS = ["12+7=", "3+45=", "8+8=", "20+19=", "5+61=", "33+3=", "9+90=", "41+14="]


def build(args, engine: str) -> CausalLMPolicy:
    tiny = {"hidden": args.hidden, "layers": args.layers, "heads": args.heads, "seed": 0}
    cfg = CausalLMConfig(model="tiny:qwen2-char", tiny_args=tiny, temperature=args.temperature,
                         max_new_tokens=args.max_new_tokens, rollout_engine=engine, device=args.device)
    cfg.vllm.gpu_memory_utilization = args.gpu_memory_utilization
    return CausalLMPolicy(cfg)


def timed_rollouts(policy: CausalLMPolicy, args) -> tuple[dict, object]:
    prompts = PROMPTS[:args.prompts]
    seeds = list(range(len(prompts)))
    start = time.perf_counter()
    policy.rollout(prompts, args.group, seeds)  # warm-up (vLLM: engine start-up, first weight sync)
    warmup = time.perf_counter() - start
    rates, rollout = [], None
    for r in range(args.repeats):
        start = time.perf_counter()
        rollout = policy.rollout(prompts, args.group, [s + 1000 * (r + 1) for s in seeds])
        elapsed = time.perf_counter() - start
        rates.append(float(rollout.unit_mask.sum()) / elapsed)
    return {"tokens_per_s": statistics.median(rates), "tokens_per_s_runs": rates, "first_call_s": warmup,
            "tokens_per_rollout": float(rollout.unit_mask.sum())}, rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = parser.parse_args()
    if args.hidden // args.heads != 64:
        print(f"note: head dim {args.hidden // args.heads} (vLLM's CPU attention needs 64 or another size it supports)")

    report = {"settings": vars(args), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "threads": torch.get_num_threads()}
    hf = build(args, "hf")
    report["hf"], _ = timed_rollouts(hf, args)
    del hf
    policy = build(args, "vllm")
    import vllm
    report["vllm_version"] = vllm.__version__
    report["vllm"], rollout = timed_rollouts(policy, args)
    with torch.no_grad():
        forward, _ = policy.logprobs(policy.model, rollout)
    real = rollout.unit_mask.bool()
    gap = (rollout.rollout_logp - forward)[real].abs()
    report["logp_diff_max"] = float(gap.max())
    report["logp_diff_mean"] = float(gap.mean())
    report["logp_tokens"] = int(real.sum())
    report["vllm_vs_hf_tokens_per_s"] = report["vllm"]["tokens_per_s"] / report["hf"]["tokens_per_s"]
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
