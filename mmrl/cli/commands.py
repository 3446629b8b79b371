"""The commands' functions: each takes the arguments `mmrl.cli.main` parsed and returns an exit code;
`mmrl.cli.main.DISPATCH` names them. Each imports the layers it needs when it runs, so that `mmrl --help`
stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mmrl.config.parse import load_recipe, parse_config
from mmrl.config.recipes import resolve_recipe
from mmrl.errors import UserError


def _same_run(recipe_name: str, recipe_cfg, run_cfg, run_config: Path) -> None:
    """Refuse a recipe whose task or model is not the run's (scoring one run with another's recipe)."""
    given = (recipe_cfg.task, recipe_cfg.policy.get("model"))
    trained = (run_cfg.task, run_cfg.policy.get("model"))
    if given != trained:
        raise UserError(f"mmrl eval: recipe {recipe_name!r} is task={given[0]} model={given[1]!r}, but the run "
                        f"({run_config}) is task={trained[0]} model={trained[1]!r}; give that run's recipe, "
                        f"--checkpoint alone, or another output_dir")


def run_config(args, checkpoint: Path | None):
    """The run's own ``config.json`` (with the overrides) when the checkpoint, or the recipe's
    output_dir, belongs to a run (said on stderr; refused when the recipe's task or model is
    another), else the recipe."""
    recipe = [a for a in args.args if "=" not in a]
    overrides = [a for a in args.args if "=" in a]
    if len(recipe) > 1:
        raise UserError(f"mmrl eval takes one recipe, got {recipe}")
    if checkpoint is None and not recipe:
        raise UserError("mmrl eval needs a recipe, or --checkpoint DIR of a run (its config.json is used)")
    cfg = load_recipe(resolve_recipe(recipe[0]), overrides) if recipe else None
    run_config = checkpoint.parent.parent / "config.json" if checkpoint is not None \
        else Path(cfg.output_dir) / "config.json"
    if not run_config.is_file():
        if cfg is None:
            raise UserError(f"--checkpoint {str(checkpoint)!r} has no run config.json beside its checkpoints "
                            f"folder ({run_config}); give the recipe it was trained with")
        return cfg
    run_cfg = parse_config(json.loads(run_config.read_text()), overrides)  # as it was trained (LoRA rank, ...)
    if cfg is not None:
        _same_run(recipe[0], cfg, run_cfg, run_config)
        print(f"mmrl eval: using the run's own config {run_config} (as it was trained), not {recipe[0]}'s; "
              f"overrides apply to it", file=sys.stderr)
    return run_cfg


def run_eval(args) -> int:
    """`mmrl eval [RECIPE] [--checkpoint DIR] [--base] [key=value ...]`: print the scores as JSON and
    write them to ``CHECKPOINT.eval.json``, or with --base (the untrained model, whatever checkpoints
    the run has) to ``OUTPUT_DIR/base.eval.json``."""
    from mmrl.train.loop.trainer import Trainer
    from mmrl.train.safety import checkpoint as ckpt
    if args.base and args.checkpoint:
        raise UserError("mmrl eval: --base scores the untrained model and --checkpoint a trained one; give one")
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    if checkpoint is not None and not (checkpoint / ckpt.STATE).is_file():
        raise UserError(f"--checkpoint {args.checkpoint!r} is not a checkpoint directory (no {ckpt.STATE})")
    cfg = run_config(args, checkpoint)
    if checkpoint is None and not args.base:
        checkpoint = ckpt.latest_checkpoint(cfg.output_dir, warn=lambda m: print(m, file=sys.stderr))
        if checkpoint is None:
            raise UserError(f"output_dir {cfg.output_dir!r} has no checkpoint to score; pass --checkpoint DIR, "
                            "or --base to score the untrained model")
    if checkpoint is not None:
        problem = ckpt.verify(checkpoint)
        if problem is not None:
            raise UserError(f"checkpoint {checkpoint} is damaged: {problem}")
    trainer = Trainer(cfg, for_training=False)
    if checkpoint is not None:
        trainer.load_checkpoint(checkpoint)
    result = trainer.evaluate()
    result["checkpoint"] = str(checkpoint) if checkpoint else None
    if trainer.accelerator.is_main_process:
        out = (checkpoint.parent / f"{checkpoint.name}.eval.json" if checkpoint
               else Path(cfg.output_dir) / "base.eval.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
    return 0


def run_explain(args) -> int:
    from mmrl.config.help import explain
    """`mmrl explain KEY [--task T]` (mmrl/cli/main.py parses its arguments)."""
    print(explain(args.key, args.task))
    return 0


def run_demo_command(args) -> int:
    from mmrl.experiments.demo import run_demo
    """`mmrl demo NAME [key=value ...]`."""
    run_demo(args.name, args.overrides)
    return 0


def run_export(args: argparse.Namespace) -> int:
    from mmrl.train.loop.export import merge_lora
    """`mmrl export CHECKPOINT --merge OUT` (mmrl/cli/main.py parses its arguments)."""
    print(merge_lora(args.checkpoint, args.merge))
    return 0


def run_train(args: argparse.Namespace) -> int:
    """`mmrl train RECIPE [key=value ...] [--ray [--address A]]`: here, or placed on Ray (cli/ray_train.py) unless
    Ray placed this process already."""
    cfg = load_recipe(resolve_recipe(args.recipe), args.overrides)
    from mmrl.distributed.launcher import placed_by_launcher
    if (args.ray or cfg.launch == "ray") and not placed_by_launcher():
        from mmrl.cli.ray_train import train_on_ray
        return train_on_ray(cfg, args.recipe, args.overrides, args.address)
    if args.address:
        raise UserError("mmrl train: --address is the Ray cluster's; give --ray (or launch=ray) with it")
    from mmrl.train.loop.trainer import Trainer
    trainer = Trainer(cfg)
    if not trainer.resumed:  # a resumed run's weights were warm-started before its first checkpoint
        trainer.warm_start()
    trainer.train()
    return 0


def run_list(args: argparse.Namespace) -> int:
    from mmrl.core.estimators import ADVANTAGE_ESTIMATORS
    from mmrl.core.objectives import AGGREGATIONS, OBJECTIVES, RATIO_LEVELS
    from mmrl.core.regularisers import CLOSED_FORM_KL, KL_ESTIMATORS
    from mmrl.core.scoring import REWARDS
    from mmrl.registry import ADAPTERS, BENCHMARKS, DEMOS, RECIPES, load_plugins
    load_plugins()
    rows = [("recipes", RECIPES.names()), ("demos", DEMOS.names()), ("task adapters", ADAPTERS.names()),
            ("benchmarks (mmrl bench)", BENCHMARKS.names()),
            ("advantage estimators (algorithm.estimator)", ADVANTAGE_ESTIMATORS.names()),
            ("objectives (algorithm.objective)", OBJECTIVES.names()),
            ("loss aggregations (algorithm.aggregation)", AGGREGATIONS.names()),
            ("ratio levels (algorithm.ratio_level)", list(RATIO_LEVELS)),
            ("KL estimators (algorithm.kl_estimator)", [*KL_ESTIMATORS.names(), CLOSED_FORM_KL]),
            ("rewards", REWARDS.names())]
    print("\n".join(f"{title}: {', '.join(names)}" for title, names in rows))
    return 0


def run_serve_reward(args: argparse.Namespace) -> int:
    """`mmrl serve-reward NAME [--port] [--host] [--device] [--batch-size] [--reward-module F] [key=value ...]`."""
    from mmrl.registry import import_user_module, load_plugins
    try:
        from mmrl.serving.server_app import bind_served_reward, serve
        from mmrl.serving.server_directory import advertised_host
    except ImportError as e:
        raise UserError(f"mmrl serve-reward needs FastAPI and uvicorn ({e}): pip install -e '.[serve]'") from None
    load_plugins()
    for module in args.reward_module:
        import_user_module(module, "--reward-module")
    try:
        fn = bind_served_reward(args.name, reward_arguments(args.args), args.device)
    except (KeyError, ValueError) as e:  # an unknown reward, a plain function that cannot load
        raise UserError(f"mmrl serve-reward: {e.args[0] if e.args else e}") from None
    advertise = advertised_host(args.host, args.advertise)
    serve(args.name, fn, args.host, args.port, args.batch_size, args.announce, advertise)
    return 0


def run_serve_rollout(args: argparse.Namespace) -> int:
    """`mmrl serve-rollout RECIPE [key=value ...] [--port] [--host] [--device] [--announce F] [--advertise H]`."""
    try:
        from mmrl.serving.app_runner import run_app
        from mmrl.serving.rollout_server import RolloutEngine, build_server_policy, rollout_app
        from mmrl.serving.server_directory import advertised_host
    except ImportError as e:
        raise UserError(f"mmrl serve-rollout needs FastAPI and uvicorn ({e}): pip install -e '.[serve]'") from None
    cfg = load_recipe(resolve_recipe(args.recipe), args.overrides)
    advertise = advertised_host(args.host, args.advertise)
    engine = RolloutEngine(build_server_policy(cfg, args.device), advertise)
    what = f"{cfg.task} {cfg.policy.get('model', '?')}"
    run_app(rollout_app(engine, what), args.host, args.port, f"serve-rollout: {what}", args.announce, advertise,
            " (POST /rollout, GET /rollout/KEY, POST /connect, POST /weights, GET /health)")
    engine.stop()
    return 0


def run_serve_teacher(args: argparse.Namespace) -> int:
    """`mmrl serve-teacher RECIPE [key=value ...] [--port] [--host] [--device] [--announce F] [--advertise H]`."""
    try:
        from mmrl.serving.app_runner import run_app
        from mmrl.serving.rollout_server import build_server_policy
        from mmrl.serving.server_directory import advertised_host
        from mmrl.serving.teacher_server import teacher_app
    except ImportError as e:
        raise UserError(f"mmrl serve-teacher needs FastAPI and uvicorn ({e}): pip install -e '.[serve]'") from None
    cfg = load_recipe(resolve_recipe(args.recipe), args.overrides)
    what = f"{cfg.task} {cfg.policy.get('model', '?')}"
    run_app(teacher_app(build_server_policy(cfg, args.device), what), args.host, args.port,
            f"serve-teacher: {what}", args.announce, advertised_host(args.host, args.advertise),
            " (POST /logprobs, GET /health)")
    return 0


def reward_arguments(items: list[str]) -> dict:
    """`mmrl serve-reward`'s ``key=value`` arguments, each value read as YAML."""
    import yaml
    found = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UserError(f"mmrl serve-reward: {item!r} is not a reward argument key=value")
        found[key] = yaml.safe_load(value)
    return found


# ----- command lines ----------------------------------------------------------------------------
def run_sweep(args: argparse.Namespace) -> int:
    """`mmrl sweep` (mmrl/cli/main.py parses its arguments)."""
    from mmrl.experiments.sweep import sweep
    overrides = args.overrides
    for item in overrides:
        if "=" not in item or item.startswith("-"):
            raise UserError(f"mmrl sweep: {item!r} is neither an option nor a key=value override")
    out = Path(args.out) if args.out else Path("outputs") / f"sweep-{Path(args.target).stem}"
    return sweep(args.target, args.grid, args.seeds, out, overrides, args.parallel, args.shard,
                 args.warm_start_ignores, cell_items=args.cell, held_out_reward=args.held_out_reward)
