"""`mmrl plan` against the allocation probe: for each size, the plan's peak (mmrl/experiments/memory_plan.py,
from the configuration alone) beside the probe's measure (scripts/memory_probe.py: CUDA's
max_memory_allocated, or the CPU profiler's allocation events) of the same recipe run for real in a
fresh process: the trainer built, then two GRPO steps of the tiny Qwen2 (`--layers`, random weights,
fp32; the second step holds AdamW's state; `--checkpointing`: with activation checkpointing), 2 prompts x `--group` completions of exactly N tokens,
one micro-batch. Prints JSON: per size the planned and measured MiB and their ratio.

    python scripts/bench_memory_plan.py --vocab 151936 --sizes 64x128,512x128,64x512,512x512 \\
        --json bench_memory_plan.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

PROMPTS = ["01+20=", "11+21="]  # 6 tokens each of the character tokenizer
MIB = 2 ** 20


def recipe(hidden: int, tokens: int, args) -> dict:
    """The step's recipe (its prompt file written to a fresh directory)."""
    from mmrl.core.scoring import REWARDS, register_reward
    if "plan_length" not in REWARDS:
        register_reward("plan_length")(lambda completions, **kw: [float(len(c)) for c in completions])
    here = tempfile.mkdtemp(prefix="mmrl-plan-")
    with open(os.path.join(here, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    return {"task": "causal_lm",
            "policy": {"model": "tiny:qwen2-char", "max_new_tokens": tokens, "min_new_tokens": tokens,
                       "gradient_checkpointing": args.checkpointing,
                       "tiny_args": {"hidden": hidden, "layers": args.layers, "heads": 4, "vocab": args.vocab,
                                     "max_positions": 8 + tokens}},
            "data": {"path": os.path.join(here, "prompts.jsonl")}, "rewards": {"plan_length": {"weight": 1.0}},
            "algorithm": {"group_size": args.group, "estimator": "grpo", "beta": 0.0},
            "optim": {"lr": 1e-5, "prompts_per_step": len(PROMPTS), "micro_batch_size": len(PROMPTS) * args.group},
            "logging": {"report_to": ["none"], "progress": False}, "output_dir": os.path.join(here, "out"),
            "max_steps": 2, "save_every": 0}


def measured(hidden: int, tokens: int, args) -> int:
    """The probe's peak bytes over building the trainer and two steps, in this process."""
    import torch
    from memory_probe import MemoryProbe
    from mmrl.config.parse import parse_config
    from mmrl.train.loop.trainer import Trainer
    torch.manual_seed(0)
    probe = MemoryProbe()
    probe.start()
    trainer = Trainer(parse_config(recipe(hidden, tokens, args)))
    trainer.train_step()
    trainer.train_step()
    probe.stop()
    return probe.peak


def planned(hidden: int, tokens: int, args) -> dict:
    from mmrl.config.parse import parse_config
    from mmrl.experiments.memory_plan import plan_memory
    return plan_memory(parse_config(recipe(hidden, tokens, args)), 1, prompt_length=len(PROMPTS[0])).as_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151936, help="the output layer's tokens")
    parser.add_argument("--sizes", default="64x128,512x128", help="HIDDENxTOKENS,... (completion tokens)")
    parser.add_argument("--group", type=int, default=2, help="completions per prompt (2 prompts)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--checkpointing", action="store_true", help="train with activation checkpointing")
    parser.add_argument("--worker", metavar="HIDDENxTOKENS", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    if args.worker:
        hidden, tokens = map(int, args.worker.split("x"))
        print(json.dumps({"peak": measured(hidden, tokens, args)}))
        return
    report = {"vocab": args.vocab, "rows": len(PROMPTS) * args.group, "layers": args.layers,
              "checkpointing": args.checkpointing, "sizes": {}}
    for size in args.sizes.split(","):
        hidden, tokens = map(int, size.split("x"))
        options = ["--vocab", str(args.vocab), "--group", str(args.group), "--layers", str(args.layers)]
        run = subprocess.run([sys.executable, __file__, "--worker", size, *options,
                              *(["--checkpointing"] if args.checkpointing else [])],
                             capture_output=True, text=True, check=True)
        peak = json.loads(run.stdout.strip().splitlines()[-1])["peak"]
        plan = planned(hidden, tokens, args)
        report["sizes"][size] = {"planned_mib": round(plan["peak"] / MIB, 1), "measured_mib": round(peak / MIB, 1),
                                 "ratio": round(plan["peak"] / peak, 4),
                                 "update_mib": {k: round(v / MIB, 1) for k, v in plan["update"].items()}}
        print(json.dumps({size: report["sizes"][size]}), file=sys.stderr)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
