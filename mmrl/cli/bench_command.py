"""`mmrl bench NAME [RECIPE] [key=value ...] --checkpoint DIR | --model ID | --base [options]`: the
arguments turned into a `BenchRun` (mmrl/experiments/bench/harness.py), which runs it."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml

from mmrl.config.parse import load_recipe, parse_config
from mmrl.config.recipes import resolve_recipe
from mmrl.errors import UserError


def _options(items: list[str], defaults: dict) -> dict:
    """``--option KEY=VALUE`` items: the value as given where the option's default is text, else read as YAML."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UserError(f"--option {item!r}: expected KEY=VALUE")
        out[key] = value if isinstance(defaults.get(key), str) else yaml.safe_load(value)
    return out


def _model_config(args: argparse.Namespace, bench, overrides: list[str]):
    """--model ID: the recipe's config (if one is given) or a bare one of the benchmark's adapter, with
    policy.model = ID."""
    recipe = [a for a in args.args if "=" not in a]
    if len(recipe) > 1:
        raise UserError(f"mmrl bench takes one recipe, got {recipe}")
    if recipe:
        return load_recipe(resolve_recipe(recipe[0]), [*overrides, f"policy.model={args.model}"])
    return parse_config({"task": bench.default_task, "policy": {"model": args.model}}, overrides)


def _config_and_place(args: argparse.Namespace, bench, overrides: list[str]):
    """(the policy's config before the protocol's settings, the checkpoint, the default OUT, the label)."""
    from mmrl.cli.commands import run_config
    from mmrl.train.safety import checkpoint as ckpt
    if args.checkpoint:
        checkpoint = Path(args.checkpoint)
        if not (checkpoint / ckpt.STATE).is_file():
            raise UserError(f"--checkpoint {args.checkpoint!r} is not a checkpoint directory (no {ckpt.STATE})")
        problem = ckpt.verify(checkpoint)
        if problem is not None:
            raise UserError(f"checkpoint {checkpoint} is damaged: {problem}")
        return run_config(args, checkpoint), checkpoint, checkpoint, str(checkpoint)
    if args.base:
        cfg = run_config(args, None)
        return cfg, None, Path(cfg.output_dir) / "base", f"base: {cfg.policy.get('model')}"
    cfg = _model_config(args, bench, overrides)
    return cfg, None, Path("outputs") / f"bench-{re.sub(r'[^A-Za-z0-9._-]+', '_', args.model)}", args.model


def run_bench_command(args: argparse.Namespace) -> int:
    """`mmrl bench` (mmrl/cli/parser.py lists its arguments): prints the summary as JSON when scored."""
    from mmrl.data.bench_rows import parse_shard
    from mmrl.experiments.bench.harness import BenchRun, run_bench
    from mmrl.experiments.bench.policy_source import protocol_config
    from mmrl.registry import BENCHMARKS
    try:
        bench = BENCHMARKS.get(args.name)
    except KeyError as e:
        raise UserError(f"mmrl bench: {e.args[0]}") from None
    overrides = [a for a in args.args if "=" in a]
    cfg = label = checkpoint = None
    out = Path(args.out) if args.out else None
    if args.checkpoint or args.model or args.base:
        cfg, checkpoint, default_out, label = _config_and_place(args, bench, overrides)
        cfg, out = protocol_config(bench, cfg, overrides), out or default_out
    elif args.stage != "score":
        raise UserError("mmrl bench: give the model: --checkpoint DIR, --model ID or --base (with a recipe)")
    elif out is None:
        raise UserError("mmrl bench --stage score: give --out OUT (where the generate stage wrote OUT/bench/NAME)")
    run = BenchRun(args.name, out, cfg, label or "", checkpoint, args.stage, parse_shard(args.shard), args.num_prompts,
                   args.data, args.split, _options(args.option, dict(bench.options)), args.scorer_url, args.seed, args.prompts_per_call)
    summary = run_bench(run)
    if summary is not None:
        print(json.dumps({k: summary[k] for k in ("benchmark", "model", "headline", "figures", "smoke_subset")}, indent=1))
    return 0
