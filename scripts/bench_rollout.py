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
import importlib.util
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's mmrl / tasks

if TYPE_CHECKING:
    from mmrl.tasks.lm.causal_lm import CausalLMPolicy

PROMPTS = ["12+7=", "3+45=", "8+8=", "20+19=", "5+61=", "33+3=", "9+90=", "41+14="]


def build(args, engine: str) -> CausalLMPolicy:
    from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy
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


def vllm_report(args) -> dict:
    """vLLM's throughput and the gap between its log-probs and the training forward's."""
    import torch
    policy = build(args, "vllm")
    import vllm
    report: dict = {"vllm_version": vllm.__version__}
    report["vllm"], rollout = timed_rollouts(policy, args)
    with torch.no_grad():
        forward, _ = policy.logprobs(policy.model, rollout)
    real = rollout.unit_mask.bool()
    gap = (rollout.rollout_logp - forward)[real].abs()
    report["logp_diff_max"] = float(gap.max())
    report["logp_diff_mean"] = float(gap.mean())
    report["logp_tokens"] = int(real.sum())
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--engines", nargs="+", choices=("hf", "vllm"), default=["hf", "vllm"],
                        help="the engines measured (vllm needs vLLM installed; the ratio needs both)")
    parser.add_argument("--device", default="cpu", help="where the policy runs (cpu, cuda)")
    parser.add_argument("--hidden", type=int, default=256, help="model width")
    parser.add_argument("--layers", type=int, default=2, help="model depth")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (hidden / heads: the head dim)")
    parser.add_argument("--prompts", type=int, default=8, help=f"prompts per rollout (at most {len(PROMPTS)})")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the most tokens per completion")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--repeats", type=int, default=3, help="timed rollouts per engine (the median is reported)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3,
                        help="policy.vllm.gpu_memory_utilization: vLLM's share of the GPU's memory (ignored on CPU)")
    args = parser.parse_args()
    if "vllm" in args.engines and importlib.util.find_spec("vllm") is None:
        parser.error("vllm is not installed in this Python: run it in the venv of scripts/make_vllm_env.sh, "
                     "or pass --engines hf")
    if args.hidden // args.heads != 64:
        print(f"note: head dim {args.hidden // args.heads} (vLLM's CPU attention needs 64 or another size it supports)")

    import torch  # after the options are checked: --help and their errors come at once
    report = {"settings": vars(args), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "threads": torch.get_num_threads()}
    if "hf" in args.engines:
        hf = build(args, "hf")
        report["hf"], _ = timed_rollouts(hf, args)
        del hf
    if "vllm" in args.engines:
        report.update(vllm_report(args))
    if "hf" in report and "vllm" in report:
        report["vllm_vs_hf_tokens_per_s"] = report["vllm"]["tokens_per_s"] / report["hf"]["tokens_per_s"]
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
