"""The command line's parser: one function per sub-command adds its arguments. Help answers without
importing torch or the plugins (recipes and demos are read from the plugins' files)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from mmrl.registry import shipped_demos, shipped_recipes

EXAMPLES = """examples:
  mmrl demo text                                   a CPU demo end to end (no download)
  mmrl train text_demo output_dir=runs/a max_steps=50 algorithm.group_size=4
  mmrl train my_recipe.yaml resume=auto            continue the run in output_dir if it has a checkpoint
  mmrl train my_recipe.yaml --ray placement.trainer=2 placement.rollout=2   trainer ranks and rollout servers on Ray
  mmrl eval --checkpoint runs/a/checkpoints/step-000050 eval.max_prompts=16
  mmrl bench gsm8k --checkpoint runs/a/checkpoints/step-000050 --num-prompts 50   a standard benchmark
  mmrl sweep text --grid algorithm.estimator=grpo,rloo --seeds 3   methods side by side, mean and standard error
  mmrl export runs/a/checkpoints/step-000050 --merge merged/   a LoRA merged into a from_pretrained directory
  mmrl plan my_recipe.yaml --gpus 8 --gpu-memory 80 --prompt-tokens 512   memory per process, what fits
  mmrl explain algorithm.mu                        a recipe key's help, type, default and allowed values
  mmrl list                                        every registered adapter, estimator, loss, reward"""


def _columns(names) -> str:
    return ", ".join(sorted(names)) or "none"


Add = Callable[..., argparse.ArgumentParser]  # add(name, help, epilog="") -> the sub-command's parser


def _train(add: Add, recipe_list: str) -> None:
    p = add("train", "train from a recipe (a shipped recipe's name, or a path to a .yaml file)",
            f"{recipe_list}\n\nresume=true|auto|false, resume_changes=allow, overwrite=true, save_total_limit=N; "
            "SIGINT/SIGTERM save a checkpoint and stop")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--ray", action="store_true",
                   help="place the trainer ranks and the servers on a Ray cluster (as launch=ray; docs/distributed.md)")
    p.add_argument("--address", help="with --ray: an existing Ray cluster's address (default: a local one)")


def _served_address(p: argparse.ArgumentParser) -> None:
    """The options a placed server is started with (its address, announced for the run)."""
    p.add_argument("--announce", metavar="FILE", help="write the server's address here once it answers (a server the "
                                                      "run placed: OUTPUT_DIR/servers/ROLE-INDEX.json)")
    p.add_argument("--advertise", metavar="HOST", help="this machine's address in the announced url (default: "
                                                       "$MMRL_NODE_ADDR, else --host, 127.0.0.1 for 0.0.0.0)")


def _serve_rollout(add: Add) -> None:
    p = add("serve-rollout", "serve a recipe's policy rollouts over HTTP for runs with policy.rollout_engine "
                             "hf_server or vllm_server (docs/distributed.md#served-rollouts); the trainer pushes its weights")
    _served_recipe(p, "the run's recipe", 8100, "the policy")


def _serve_teacher(add: Add) -> None:
    p = add("serve-teacher", "serve a recipe's policy, frozen, as an on-policy distillation teacher over HTTP: it "
                             "scores the units of the rollouts a run sends (algorithm.distill.teacher: {url: ...})")
    _served_recipe(p, "a recipe whose policy section is the teacher's (e.g. the student's with policy.model=TEACHER)",
                   8200, "the teacher")


def _served_recipe(p: argparse.ArgumentParser, recipe: str, port: int, what: str) -> None:
    """The arguments of a server of a recipe's policy: the recipe, its overrides, where it listens and runs."""
    p.add_argument("recipe", help=f"{recipe}: a shipped recipe's name, or a path to a .yaml file")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--port", type=int, default=port, help=f"port to listen on (default {port}; 0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--device", help=f"where {what} runs (default: the recipe's policy.device, else cuda if "
                                    "there is one, else cpu)")
    _served_address(p)


def _eval(add: Add, recipe_list: str) -> None:
    p = add("eval", "score a checkpoint on its run's held-out prompts (the run's config.json, with overrides)",
            f"{recipe_list}\n\nwithout --checkpoint: the newest good checkpoint of the recipe's output_dir; "
            "scores go to CHECKPOINT.eval.json")
    p.add_argument("args", nargs="*", metavar="[RECIPE] key=value",
                   help="a recipe (optional with --checkpoint) and overrides, in any order")
    p.add_argument("--checkpoint", help="a checkpoint directory (default: newest good one in output_dir)")
    p.add_argument("--base", action="store_true",
                   help="score the untrained model (policy.model), even where the run has checkpoints; "
                        "scores go to OUTPUT_DIR/base.eval.json")


def _bench(add: Add, recipe_list: str) -> None:
    p = add("bench", "score a model on a registered benchmark by its published protocol (docs/bench.md); results "
                     "in OUT/bench/NAME/ (samples, scores, summary.json with standard errors, report.md)",
            f"{recipe_list}\n\nbenchmarks: `mmrl list`; --stage generate / score run apart (another machine, a judge "
            "server started later); --shard i/n splits the prompts and a rerun skips finished shards")
    p.add_argument("name", metavar="NAME", help="a registered benchmark, e.g. gsm8k, math500, refcoco, librispeech_clean")
    p.add_argument("args", nargs="*", metavar="[RECIPE] key=value",
                   help="a recipe (optional with --checkpoint or --model) and policy overrides, in any order")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", help="a checkpoint directory of a run (its config.json is used)")
    which.add_argument("--model", help="a model id or directory (policy.model), with the recipe's or the benchmark's adapter")
    which.add_argument("--base", action="store_true", help="the run's starting model (policy.model of the recipe's run)")
    p.add_argument("--out", help="results go to OUT/bench/NAME/ (default: the checkpoint directory; OUTPUT_DIR/base "
                                 "with --base; outputs/bench-MODEL with --model)")
    p.add_argument("--stage", default="all", choices=("all", "generate", "score"),
                   help="generate the samples, score them, or both (default; scores once every shard is finished)")
    p.add_argument("--shard", metavar="i/n", help="generate only prompts i, i + n, ... (0 <= i < n)")
    p.add_argument("--num-prompts", type=int, help="a smoke subset: the first N prompts (marked so in the summary)")
    p.add_argument("--data", help="a local copy of the benchmark's data in its source's format (default: its hub data set)")
    p.add_argument("--split", help="another split than the benchmark's own")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a protocol option of the benchmark (docs/bench.md lists them), value read as YAML")
    p.add_argument("--scorer-url", help="score at this server (mmrl serve-reward SCORER, or a judge's server)")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples (default 0): sample k of a prompt is "
                                                       "drawn from (seed, prompt id, k)")
    p.add_argument("--prompts-per-call", type=int, default=16, help="prompts per rollout call (default 16)")


def _serve_reward(add: Add) -> None:
    p = add("serve-reward", "serve a registered reward over HTTP (POST /score, GET /health) for recipes "
                            "that name it with rewards.NAME.url (docs/rewards.md#served-rewards)")
    p.add_argument("name", metavar="NAME", help="a registered reward, or FILE.py:FUNCTION")
    p.add_argument("args", nargs="*", metavar="key=value", help="arguments bound to the reward")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--device", help="the reward's device argument (e.g. cuda:1)")
    p.add_argument("--batch-size", type=int, default=64, help="rows per call of the reward (default 64)")
    p.add_argument("--reward-module", action="append", default=[], metavar="FILE",
                   help="a file or module to import first, so its @register_reward names can be served")
    _served_address(p)


def _demo_list_explain_export(add: Add, demos: list[str]) -> None:
    p = add("demo", "run an embedded CPU demo end to end (no download)", f"demos: {_columns(demos)}")
    p.add_argument("name", metavar="NAME", help=f"one of: {_columns(demos)}")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    add("list", "print every registered name (adapters, benchmarks, estimators, losses, rewards; imports the plugins)")
    p = add("explain", "print a recipe key's help, type, default and allowed values")
    p.add_argument("key", help="a dotted recipe key, e.g. algorithm.mu or policy.p_mask")
    p.add_argument("--task", help="the adapter whose policy section to read (default: causal_lm)")
    p = add("export", "write a checkpoint where users load it (--merge: the LoRA merged into the base, "
                      "a plain from_pretrained directory with its tokenizer / processor, or a diffusers pipeline)")
    p.add_argument("checkpoint", help="OUTPUT_DIR/checkpoints/step-N")
    p.add_argument("--merge", required=True, metavar="OUT", help="directory for the merged model")


def _plan(add: Add, recipe_list: str) -> None:
    p = add("plan", "a recipe's peak memory per process by component, from the model's configuration alone (no "
                    "weights read), and the largest group size and micro-batch that fit (docs/memory-plan.md)",
            recipe_list)
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--gpus", type=int, default=1, help="processes, one per GPU (default 1); the strategy "
                                                       "(distributed.strategy) divides the training state over them")
    p.add_argument("--gpu-memory", type=float, metavar="GB",
                   help="one GPU's memory in GiB: also print the largest group size and micro-batch that fit")
    p.add_argument("--prompt-tokens", type=int, metavar="N",
                   help="the longest prompt in tokens (default: policy.max_prompt_length)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def _sweep(add: Add) -> None:
    p = add("sweep", "run a grid of settings x seeds as separate runs, with mean and standard error per "
                     "cell (see docs/sweep.md)")
    p.add_argument("target", metavar="RECIPE_OR_DEMO", help="a demo name, a recipe name or a YAML path")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="one grid axis (repeat for more); the cells are the product of the axes")
    p.add_argument("--cell", action="append", default=[], metavar='"K=V K2=V2"',
                   help="one cell given as several settings (repeat; together one more grid axis)")
    p.add_argument("--seeds", type=int, required=True, help="seeds 0 .. N-1 for every cell")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--shard", help="i/n: only runs i, i + n, ... (0 <= i < n), e.g. one per machine")
    p.add_argument("--out", help="output directory (default outputs/sweep-TARGET)")
    p.add_argument("--warm-start-ignores", action="append", default=[], metavar="KEY",
                   help="a config key the warm start does not read (e.g. policy.sampler): cells "
                        "differing only there share a warm start")
    p.add_argument("--held-out-reward", metavar="NAME",
                   help="compare the cells on this reward component (every cell declares it, any weight) "
                        "instead of the combined reward, e.g. when a cell trains on a win rate")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every sub-command (each added by its function above, in the order `--help` lists them)."""
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
    _train(add, recipe_list)
    _eval(add, recipe_list)
    _bench(add, recipe_list)
    _serve_reward(add)
    _serve_rollout(add)
    _serve_teacher(add)
    _demo_list_explain_export(add, demos)
    _sweep(add)
    _plan(add, recipe_list)
    return parser
