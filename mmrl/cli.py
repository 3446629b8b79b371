"""``mmrl train RECIPE [key=value ...]``, ``mmrl eval``, ``mmrl demo NAME``, ``mmrl explain KEY``;
``python -m mmrl`` too."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .registry import DEMOS, RECIPES, load_plugins


def _catalogue() -> str:
    from .advantages import ESTIMATORS
    from .loss import AGGREGATIONS, CLOSED_FORM_KL, KL_ESTIMATORS, OBJECTIVES, RATIO_LEVELS
    from .reward_registry import REWARDS
    from .registry import ADAPTERS
    load_plugins()
    rows = [("recipes", RECIPES.names()), ("demos", DEMOS.names()), ("task adapters", ADAPTERS.names()),
            ("advantage estimators (algorithm.estimator)", ESTIMATORS.names()),
            ("objectives (algorithm.objective)", OBJECTIVES.names()),
            ("loss aggregations (algorithm.aggregation)", AGGREGATIONS.names()),
            ("ratio levels (algorithm.ratio_level)", list(RATIO_LEVELS)),
            ("KL estimators (algorithm.kl_estimator)", [*KL_ESTIMATORS.names(), CLOSED_FORM_KL]),
            ("rewards", REWARDS.names())]
    return "\n".join(f"  {title}: {', '.join(names)}" for title, names in rows)


def resolve_recipe(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return Path(RECIPES.get(name_or_path))


def main(argv: list[str] | None = None) -> int:
    from .config import ConfigError
    from .reward_registry import RewardError
    try:
        return _run(argv)
    except (ConfigError, RewardError, KeyError, ValueError, FileNotFoundError, ImportError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"mmrl: error: {message}", file=sys.stderr)
        return 2


def _run(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="mmrl", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Group-relative RL fine-tuning (GRPO and descendants) for generative models.",
        epilog="registered:\n" + _catalogue() + "\n\nany recipe field can be overridden as key=value "
               "(dotted for nested fields, e.g. algorithm.beta=0.04)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="train from a recipe (a name from the list, or a YAML path)")
    p_train.add_argument("recipe")
    p_train.add_argument("overrides", nargs="*", metavar="key=value")
    p_eval = sub.add_parser("eval", help="score a checkpoint on the recipe's held-out prompts")
    p_eval.add_argument("recipe")
    p_eval.add_argument("overrides", nargs="*", metavar="key=value")
    p_eval.add_argument("--checkpoint", help="a checkpoint directory (default: newest in output_dir)")
    p_demo = sub.add_parser("demo", help="run an embedded CPU demo end to end (no download)")
    p_demo.add_argument("name", choices=None)
    p_demo.add_argument("overrides", nargs="*", metavar="key=value")
    p_explain = sub.add_parser("explain", help="print a recipe key's help, type, default and allowed values")
    p_explain.add_argument("key", help="a dotted recipe key, e.g. algorithm.mu or policy.p_mask")
    p_explain.add_argument("--task", help="the adapter whose policy section to read (default: causal_lm)")
    args = parser.parse_args(argv)

    if args.command == "explain":
        from .explain import explain
        print(explain(args.key, args.task))
        return 0

    from .config import load_recipe
    if args.command == "demo":
        from .demo import run_demo
        run_demo(args.name, args.overrides)
        return 0
    cfg = load_recipe(resolve_recipe(args.recipe), args.overrides)
    from .trainer import Trainer
    if args.command == "train":
        trainer = Trainer(cfg)
        trainer.train()
        return 0
    from . import checkpoint as ckpt
    trainer = Trainer(cfg)
    path = Path(args.checkpoint) if args.checkpoint else ckpt.latest_checkpoint(cfg.output_dir)
    if path is not None:
        trainer.load_checkpoint(path)
    result = trainer.evaluate()
    result["checkpoint"] = str(path) if path else None
    if trainer.accelerator.is_main_process:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
