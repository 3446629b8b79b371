"""``mmrl train RECIPE [key=value ...]``, ``mmrl eval``, ``mmrl bench``, ``mmrl demo NAME``, ``mmrl sweep``, ``mmrl export``,
``mmrl explain``, ``mmrl list``, ``mmrl serve-reward``, ``mmrl serve-rollout``, ``mmrl serve-teacher``; ``python -m mmrl``
too.

Help answers without importing torch or the plugins: recipes and demos are read from the plugins'
``recipes/*.yaml`` and ``demos.yaml`` files. A sub-command is a subparser (mmrl/cli/parser.py) plus one
line in `DISPATCH` naming the module and function that run it (imported only when it runs).

Errors in what the user wrote (`mmrl.errors.UserError`, or an input error raised while the run reads
its recipe, data and model paths) print one line; anything else prints its full traceback
(``--debug`` prints it for both).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from mmrl.cli.parser import build_parser
from mmrl.errors import is_user_error, message

# command -> (module, function(args) -> exit code); the module is imported only to run the command
DISPATCH = {
    "train": ("mmrl.cli.commands", "run_train"),
    "eval": ("mmrl.cli.commands", "run_eval"),
    "bench": ("mmrl.cli.bench_command", "run_bench_command"),
    "serve-reward": ("mmrl.cli.commands", "run_serve_reward"),
    "serve-rollout": ("mmrl.cli.commands", "run_serve_rollout"),
    "serve-teacher": ("mmrl.cli.commands", "run_serve_teacher"),
    "demo": ("mmrl.cli.commands", "run_demo_command"),
    "list": ("mmrl.cli.commands", "run_list"),
    "sweep": ("mmrl.cli.commands", "run_sweep"),
    "export": ("mmrl.cli.commands", "run_export"),
    "explain": ("mmrl.cli.commands", "run_explain"),
    "plan": ("mmrl.cli.plan_command", "run_plan"),
}


def end_process_group() -> None:
    """After a run over several processes: wait for all of them, then free the process group and
    its communication threads before the interpreter exits (a group torn down at exit, gloo's
    under a sharding engine, could abort the process after the run had finished)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command in ("eval", "bench", "serve-reward") and not any(x.startswith("-") for x in extra):
        args.args += extra  # overrides after an option (`--checkpoint DIR key=value`)
    elif extra and args.command in ("sweep", "train", "serve-rollout", "serve-teacher") and not any(x.startswith("-") for x in extra):
        args.overrides += extra  # overrides after the command's options
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
    others), its output flushed, then os._exit(code), without the interpreter's teardown. The sharding
    strategies' device meshes and engines keep references to the ended gloo group, and destroying it during
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
