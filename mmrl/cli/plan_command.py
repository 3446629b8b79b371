"""`mmrl plan RECIPE [key=value ...] [--gpus N] [--gpu-memory GB] [--prompt-tokens N] [--json]`: the
recipe's memory per process by component, from the model's configuration alone
(mmrl/experiments/memory_plan.py, docs/memory-plan.md)."""

from __future__ import annotations

import argparse
import json

from mmrl.config.parse import load_recipe
from mmrl.config.recipes import resolve_recipe
from mmrl.errors import UserError


def run_plan(args: argparse.Namespace) -> int:
    from mmrl.experiments.memory_plan import plan_memory, plan_table
    cfg = load_recipe(resolve_recipe(args.recipe), args.overrides)
    prompt_tokens = args.prompt_tokens if args.prompt_tokens is not None else cfg.policy.get("max_prompt_length")
    if prompt_tokens is None:
        raise UserError("mmrl plan: give --prompt-tokens N (the longest prompt, in tokens), or set "
                        "policy.max_prompt_length")
    for name, value in (("--gpus", args.gpus), ("--prompt-tokens", prompt_tokens)):
        if value < (1 if name == "--gpus" else 0):
            raise UserError(f"mmrl plan: {name} {value} is out of range")
    device = None if args.gpu_memory is None else int(args.gpu_memory * 2 ** 30)
    if device is not None and device <= 0:
        raise UserError(f"mmrl plan: --gpu-memory {args.gpu_memory} must be positive (GiB)")
    plan = plan_memory(cfg, args.gpus, prompt_tokens, device)
    print(json.dumps(plan.as_dict(), indent=1) if args.json else plan_table(plan))
    return 0
