"""``mmrl train RECIPE [key=value ...]``, ``mmrl eval``, ``mmrl demo NAME``, ``mmrl sweep``, ``mmrl export``,
``mmrl explain``, ``mmrl list``; ``python -m mmrl`` too.

Help answers without importing torch or the plugins: recipes and demos are read from the plugins'
``recipes/*.yaml`` and ``demos.yaml`` files. A sub-command is a subparser here plus one line in
`DISPATCH` naming the module and function that run it (imported only when it runs).

Errors in what the user wrote (`mmrl.errors.UserError`, or an input error raised while the run reads
its recipe, data and model paths) print one line; anything else prints its full traceback
(``--debug`` prints it for both).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from mmrl.errors import is_user_error, message
from mmrl.registry import shipped_demos, shipped_recipes

# command -> (module, function(args) -> exit code); the module is imported only to run the command
DISPATCH = {
    "train": ("mmrl.cli.commands", "run_train"),
    "eval": ("mmrl.cli.commands", "run_eval"),
    "serve-reward": ("mmrl.cli.commands", "run_serve_reward"),
    "demo": ("mmrl.cli.commands", "run_demo_command"),
    "list": ("mmrl.cli.commands", "run_list"),
    "sweep": ("mmrl.cli.commands", "run_sweep"),
    "export": ("mmrl.cli.commands", "run_export"),
    "explain": ("mmrl.cli.commands", "run_explain"),
}


EXAMPLES = """examples:
  mmrl demo text                                   a CPU demo end to end (no download)
  mmrl train text_demo output_dir=runs/a max_steps=50 algorithm.group_size=4
  mmrl train my_recipe.yaml resume=auto            continue the run in output_dir if it has a checkpoint
  mmrl eval --checkpoint runs/a/checkpoints/step-000050 eval.max_prompts=16
  mmrl sweep text --grid algorithm.estimator=grpo,rloo --seeds 3   methods side by side, mean and standard error
  mmrl export runs/a/checkpoints/step-000050 --merge merged/   a LoRA merged into a from_pretrained directory
  mmrl explain algorithm.mu                        a recipe key's help, type, default and allowed values
  mmrl list                                        every registered adapter, estimator, loss, reward"""


def _columns(names) -> str:
    return ", ".join(sorted(names)) or "none"


def build_parser() -> argparse.ArgumentParser:
    recipes, demos = shipped_recipes(), shipped_demos()
    parser = argparse.ArgumentParser(
        prog="mmrl", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Group-relative RL fine-tuning (GRPO and descendants) for generative models.",
        epilog=f"recipes: {_columns(recipes)}\ndemos: {_columns(demos)}\n\n{EXAMPLES}\n\n"
               "any recipe field can be overridden as key=value (dotted for nested fields, e.g. "
               "algorithm.beta=0.04); `mmrl list` prints every registered name")
    parser.add_argument("--debug", action="store_true", help="print the full traceback of every error")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str, epilog: str = "") -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the full traceback of every error")
        return p

    recipe_list = f"recipes: {_columns(recipes)}"
    p_train = add("train", "train from a recipe (a shipped recipe's name, or a path to a .yaml file)",
                  f"{recipe_list}\n\nresume=true|auto|false, resume_changes=allow, overwrite=true, save_total_limit=N; "
                  "SIGINT/SIGTERM save a checkpoint and stop")
    p_train.add_argument("recipe")
    p_train.add_argument("overrides", nargs="*", metavar="key=value")
    p_eval = add("eval", "score a checkpoint on its run's held-out prompts (the run's config.json, with overrides)",
                 f"{recipe_list}\n\nwithout --checkpoint: the newest good checkpoint of the recipe's output_dir; "
                 "scores go to CHECKPOINT.eval.json")
    p_eval.add_argument("args", nargs="*", metavar="[RECIPE] key=value",
                        help="a recipe (optional with --checkpoint) and overrides, in any order")
    p_eval.add_argument("--checkpoint", help="a checkpoint directory (default: newest good one in output_dir)")
    p_eval.add_argument("--base", action="store_true",
                        help="score the untrained model (policy.model), even where the run has checkpoints; "
                             "scores go to OUTPUT_DIR/base.eval.json")
    p_serve = add("serve-reward", "serve a registered reward over HTTP (POST /score, GET /health) for recipes "
                                  "that name it with rewards.NAME.url (docs/rewards.md#served-rewards)")
    p_serve.add_argument("name", metavar="NAME", help="a registered reward, or FILE.py:FUNCTION")
    p_serve.add_argument("args", nargs="*", metavar="key=value", help="arguments bound to the reward")
    p_serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p_serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p_serve.add_argument("--device", help="the reward's device argument (e.g. cuda:1)")
    p_serve.add_argument("--batch-size", type=int, default=64, help="rows per call of the reward (default 64)")
    p_serve.add_argument("--reward-module", action="append", default=[], metavar="FILE",
                         help="a file or module to import first, so its @register_reward names can be served")
    p_demo = add("demo", "run an embedded CPU demo end to end (no download)", f"demos: {_columns(demos)}")
    p_demo.add_argument("name", metavar="NAME", help=f"one of: {_columns(demos)}")
    p_demo.add_argument("overrides", nargs="*", metavar="key=value")
    add("list", "print every registered name (adapters, estimators, losses, rewards; imports the plugins)")
    p_explain = add("explain", "print a recipe key's help, type, default and allowed values")
    p_explain.add_argument("key", help="a dotted recipe key, e.g. algorithm.mu or policy.p_mask")
    p_explain.add_argument("--task", help="the adapter whose policy section to read (default: causal_lm)")
    p_export = add("export", "write a checkpoint where users load it (--merge: the LoRA merged into the base, "
                             "a plain from_pretrained directory with its tokenizer / processor, or a diffusers pipeline)")
    p_export.add_argument("checkpoint", help="OUTPUT_DIR/checkpoints/step-N")
    p_export.add_argument("--merge", required=True, metavar="OUT", help="directory for the merged model")
    p_sweep = add("sweep", "run a grid of settings x seeds as separate runs, with mean and standard error per "
                           "cell (see docs/sweep.md)")
    p_sweep.add_argument("target", metavar="RECIPE_OR_DEMO", help="a demo name, a recipe name or a YAML path")
    p_sweep.add_argument("overrides", nargs="*", metavar="key=value")
    p_sweep.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                         help="one grid axis (repeat for more); the cells are the product of the axes")
    p_sweep.add_argument("--cell", action="append", default=[], metavar='"K=V K2=V2"',
                         help="one cell given as several settings (repeat; together one more grid axis)")
    p_sweep.add_argument("--seeds", type=int, required=True, help="seeds 0 .. N-1 for every cell")
    p_sweep.add_argument("--parallel", type=int, default=1, help="runs at a time (default 1)")
    p_sweep.add_argument("--shard", help="i/n: only runs i, i + n, ... (0 <= i < n), e.g. one per machine")
    p_sweep.add_argument("--out", help="output directory (default outputs/sweep-TARGET)")
    p_sweep.add_argument("--warm-start-ignores", action="append", default=[], metavar="KEY",
                         help="a config key the warm start does not read (e.g. policy.sampler): cells "
                              "differing only there share a warm start")
    p_sweep.add_argument("--held-out-reward", metavar="NAME",
                         help="compare the cells on this reward component (every cell declares it, any weight) "
                              "instead of the combined reward, e.g. when a cell trains on a win rate")
    return parser


def end_process_group() -> None:
    """After a run over several processes: wait for all of them, then free the process group and
    its communication threads before the interpreter exits (a group torn down at exit, gloo's
    under DeepSpeed, could abort the process after the run had finished)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command in ("eval", "serve-reward") and not any(x.startswith("-") for x in extra):
        args.args += extra  # overrides after an option (`--checkpoint DIR key=value`)
    elif extra and args.command == "sweep" and not any(x.startswith("-") for x in extra):
        args.overrides += extra  # overrides after the sweep's options
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    module, function = DISPATCH[args.command]
    try:
        code = getattr(importlib.import_module(module), function)(args)
        end_process_group()
        return code
    except Exception as e:  # the one place that decides how an error is shown
        if not is_user_error(e):
            raise
        if debug:
            traceback.print_exc()
        if hasattr(e, "exit_code"):  # a run stopped on a signal, its checkpoint written: not an error
            print(f"mmrl: {message(e)}", file=sys.stderr)
            return e.exit_code
        print(f"mmrl: error: {message(e)}", file=sys.stderr)
        return 2


def exit_without_teardown(code: int) -> None:
    """End a process of a multi-process run: its process group ended (after a success only: a
    failed process leaves at once, so the launcher sees it instead of a barrier waiting on the
    others), its output flushed, then os._exit(code), without the interpreter's teardown. FSDP's
    device mesh and DeepSpeed keep references to the ended gloo group, and destroying it during
    teardown aborted finished processes now and then ("terminate called without an active
    exception", SIGABRT after their last output)."""
    if code == 0:
        end_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run() -> None:
    """The entry point of `mmrl` and `python -m mmrl`: main(), then exit with its code; a process
    of a multi-process run (WORLD_SIZE > 1, set by torchrun and accelerate launch) through
    `exit_without_teardown`, except with a vLLM engine, whose engine-core processes are shut
    down by the teardown."""
    code = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "vllm" not in sys.modules:
        exit_without_teardown(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
