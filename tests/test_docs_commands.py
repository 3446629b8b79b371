"""The documentation's commands run (tests/docs_commands.py says which lines are commands and how a
command that cannot run here is marked).

Each document's commands run in order, in a scratch directory of their own, as a reader runs them
(in this process, through `mmrl.cli.main`; `mmrl serve-reward` as a server in a subprocess, left
running for the document's later commands), with overrides that keep them to seconds: one step
(`FAST`), a one-step warm start where the recipe has one, a small evaluation, and the tiny model of
the task where a recipe names one from the hub. In the scratch directory are the files the docs'
code blocks name (`# my_rewards.py`, `# my_recipe.yaml`), the rows those recipes read (`ROWS`), and
the repository's tests/ and scripts/; a checkpoint path ``DIR/checkpoints/step-N`` names the newest
checkpoint the commands before it wrote in DIR; each port a server listens on is a free one.

A marked command (`needs: ...`) is parsed: its arguments by the command line's parser, its recipe
and overrides validated as `mmrl train` validates them before anything loads (a missing data file
or local model path excused where the marker says the user brings it). A synopsis (a placeholder
in capitals) names a sub-command that exists. The commands marked `needs: minutes` run, with the
same overrides, in the slow suite.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from docs_commands import NEEDS, ROOT, Command, all_commands, example_files
from served import free_port, wait_healthy

from mmrl.cli.main import DISPATCH, main
from mmrl.cli.parser import build_parser

COMMANDS = all_commands()
FAST = {  # appended to a command's own overrides (they win): one step, a small evaluation, no trackers
    "train": ["max_steps=1", "optim.prompts_per_step=1", "eval.max_prompts=2", "eval.group_size=2",
              "logging.report_to=[none]", "logging.progress=false"],
    "eval": ["eval.max_prompts=2", "eval.group_size=2", "logging.report_to=[none]", "logging.progress=false"],
}
FAST["demo"] = FAST["train"]
TINY_MODEL = {  # a recipe naming a hub model runs with its task's tiny one
    "causal_lm": ["policy.model=tiny:qwen2-char", "policy.dtype=float32", "policy.max_new_tokens=8",
                  "policy.tiny_args={hidden: 32, layers: 1, heads: 2}"],
}
ROWS = {  # the rows the docs' recipes read: {"prompt": ..., "answer": ...} (README.md's my_recipe.yaml)
    name: "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(n) for b in range(3))
    for name, n in (("train.jsonl", 4), ("test.jsonl", 2))
}
# a marked command's validation problems that the marker excuses (the user brings the file)
EXCUSED = {"data": r"data\.(eval_)?path: .* does not exist", "weights": r"local path .* does not exist"}


def scratch(path: Path) -> Path:
    """A scratch directory with the docs' example files, the rows they read, tests/ and scripts/."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in {**example_files(), **ROWS}.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    for folder in ("tests", "scripts"):
        (path / folder).symlink_to(ROOT / folder)
    return path


def parsed(argv: list[str]):
    """The command line's parse of `argv`, as `mmrl.cli.main.main` completes it."""
    args, extra = build_parser().parse_known_args(argv)
    assert not [x for x in extra if x.startswith("-")], f"unknown options {extra}"
    if extra and args.command in ("eval", "bench", "serve-reward"):
        args.args += extra
    elif extra and args.command in ("sweep", "train", "serve-rollout"):
        args.overrides += extra
    else:
        assert not extra, f"unrecognised arguments {extra}"
    return args


def recipe_of(args) -> Path | None:
    from mmrl.config.recipes import resolve_recipe
    from mmrl.registry import DEMOS, RECIPES, load_plugins
    load_plugins()
    if args.command in ("train", "sweep"):
        target = getattr(args, "recipe", None) or args.target
        return RECIPES.get(DEMOS.get(target)) if args.command == "sweep" and target in DEMOS.names() \
            else resolve_recipe(target)
    if args.command == "demo":
        return RECIPES.get(DEMOS.get(args.name))
    recipes = [a for a in getattr(args, "args", []) if "=" not in a] if args.command == "eval" else []
    return resolve_recipe(recipes[0]) if recipes else None


def processes(command: Command) -> int:
    """How many processes the command's launcher starts (1 without one; with --ray, placement.trainer)."""
    if "--ray" in command.argv:
        given = [a.split("=", 1)[1] for a in command.argv if a.startswith("placement.trainer=")]
        return int(given[-1]) if given else 1
    found = dict(zip(command.launcher, command.launcher[1:]))
    if "--config_file" in found:
        return int(yaml.safe_load((ROOT / found["--config_file"]).read_text()).get("num_processes", 1))
    return int(found.get("--nproc_per_node", 1)) * int(found.get("--nnodes", 1))


def excused(problem: str, needs: set[str]) -> bool:
    return any(re.search(EXCUSED[n], problem) for n in needs if n in EXCUSED)


def check_parses(command: Command) -> None:
    """A marked command's arguments, recipe and overrides are what `mmrl` accepts before it loads
    anything (validation problems the marker excuses aside)."""
    from mmrl.config.parse import ConfigError, load_recipe
    from mmrl.train.plan.validate import validate
    args = parsed(command.argv)
    if args.command == "serve-reward":
        from mmrl.cli.commands import reward_arguments
        from mmrl.registry import import_user_module
        from mmrl.serving.server_app import bind_served_reward
        for module in args.reward_module:
            import_user_module(module, "--reward-module")
        bind_served_reward(args.name, reward_arguments(args.args), args.device)
        return
    if args.command == "sweep":
        from mmrl.experiments.sweep import checked_runs
        checked_runs(args.target, args.grid, args.seeds, Path(args.out or "outputs/sweep"), args.overrides,
                     args.cell, args.held_out_reward)
        return
    recipe = recipe_of(args)
    if recipe is None:  # an eval or export of a run the reader has
        return
    overrides = [a for a in (getattr(args, "overrides", None) or getattr(args, "args", [])) if "=" in a]
    try:
        validate(load_recipe(recipe, overrides), processes(command), warn=lambda message: None)
    except ConfigError as e:
        problems = [p.strip() for p in str(e).splitlines() if not re.match(r"\d+ problems in the recipe", p)]
        left = [p for p in problems if not excused(p, command.needs)]
        assert not left, f"{command.where}: `{command.text}`: {left}"


def speed_overrides(args, recipe: Path | None) -> list[str]:
    """`FAST` for the command, a one-step warm start where the recipe has one, and the task's tiny
    model where the recipe names a hub model."""
    from mmrl.config.parse import load_recipe
    extra = list(FAST.get(args.command, []))
    if recipe is None:
        return extra
    given = args.args if args.command == "eval" else args.overrides
    cfg = load_recipe(recipe, [a for a in given if "=" in a])
    if cfg.warm_start.steps > 0 and args.command != "eval":
        extra += ["warm_start.steps=1", "warm_start.batch_size=2"]
    model = str(cfg.policy.get("model", ""))
    if not model.startswith(("tiny:", "/", ".")):
        assert cfg.task in TINY_MODEL, f"recipe {recipe} names {model!r}: mark the command `needs: weights`"
        extra += TINY_MODEL[cfg.task]
    return extra


def newest_checkpoint(token: str, here: Path) -> str:
    """A ``DIR/checkpoints/step-N`` token as the newest checkpoint the commands wrote in DIR."""
    match = re.search(r"(.*)/checkpoints/step-\d+/?$", token)
    if not match or not (here / match.group(1) / "checkpoints").is_dir():
        return token
    steps = sorted((here / match.group(1) / "checkpoints").glob("step-*"))
    return str(steps[-1].relative_to(here)) if steps else token


class Session:
    """A reader going through one document's commands in `here`: servers started are kept until
    the end (`close`), each doc port mapped to a free one."""

    def __init__(self, here: Path):
        self.here, self.ports, self.servers = here, {}, {}

    def argv(self, command: Command) -> list[str]:
        """The command's arguments with this session's ports and checkpoints."""
        text = shlex.join(command.argv)
        for doc_port, port in self.ports.items():
            text = re.sub(rf"(:|--port ){doc_port}\b", rf"\g<1>{port}", text)
        return [newest_checkpoint(token, self.here) for token in shlex.split(text)]

    def serve(self, command: Command, argv: list[str]) -> None:
        """Start the server of `mmrl serve-reward ...` on a free port for the doc's port."""
        doc_port = command.argv[command.argv.index("--port") + 1]
        if doc_port in self.servers:  # a later example on the same port: the earlier server goes
            self.stop(doc_port)
        self.ports[doc_port] = port = free_port()
        argv[argv.index("--port") + 1] = str(port)
        process = subprocess.Popen([sys.executable, "-m", "mmrl", *argv], cwd=self.here, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        self.servers[doc_port] = process
        wait_healthy(f"http://127.0.0.1:{port}", process, timeout=120)

    def stop(self, doc_port: str) -> None:
        process = self.servers.pop(doc_port)
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def run(self, command: Command, capsys) -> None:
        argv = self.argv(command)
        if not {"-h", "--help"} & set(argv):  # a help line runs as it is (the parser exits 0)
            args = parsed(argv)
            if args.command == "serve-reward":
                return self.serve(command, argv)
            recipe = recipe_of(args) if args.command in ("train", "demo", "eval") else None
            argv += speed_overrides(args, recipe) if args.command in ("train", "demo", "eval") else []
        try:
            code = main(argv)
        except SystemExit as e:  # --help
            code = e.code
        out = capsys.readouterr()
        assert code == 0, f"{command.where}: `{command.text}` (run as mmrl {' '.join(argv)}) exited {code}:\n" \
                          f"{(out.out + out.err)[-3000:]}"

    def close(self) -> None:
        for doc_port in list(self.servers):
            self.stop(doc_port)


def test_every_command_is_runnable_marked_or_a_synopsis():
    assert len(COMMANDS) > 50 and {c.document for c in COMMANDS} >= {"README.md", "docs/recipes.md"}
    assert {"my_recipe.yaml", "my_rewards.py"} <= set(example_files())  # the files the commands name
    for command in COMMANDS:
        assert command.needs <= set(NEEDS), f"{command.where}: needs {command.needs - set(NEEDS)}; known: {set(NEEDS)}"
        assert command.sub_command in DISPATCH or command.sub_command == "--help", command.where
        if command.launcher[:1] in (["torchrun"], ["accelerate"]):
            assert command.needs, f"{command.where}: a multi-process launch takes minutes here at least: mark it"


MARKED = [c for c in COMMANDS if c.needs and not c.synopsis]


@pytest.mark.parametrize("command", MARKED, ids=[c.where for c in MARKED])
def test_a_marked_command_parses_and_its_recipe_validates(command, tmp_path, monkeypatch):
    monkeypatch.chdir(scratch(tmp_path))
    check_parses(command)


def documents_to_run() -> list[str]:
    return sorted({c.document for c in COMMANDS if not c.needs and not c.synopsis})


@pytest.mark.parametrize("document", documents_to_run())
def test_the_commands_of_a_document_run(document, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(scratch(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    session = Session(tmp_path)
    try:
        for command in (c for c in COMMANDS if c.document == document and not c.needs and not c.synopsis):
            session.run(command, capsys)
    finally:
        session.close()


SLOW = [c for c in COMMANDS if "minutes" in c.needs and not c.synopsis]


@pytest.mark.slow  # minutes each: the demos with a one-step warm start and RL, the sweeps with one seed, launches
@pytest.mark.parametrize("command", SLOW, ids=[c.where for c in SLOW])
def test_a_command_that_takes_minutes_runs_with_one_step(command, tmp_path):
    here = scratch(tmp_path)
    args = parsed(command.argv)
    argv = list(command.argv)
    if args.command == "sweep":
        argv[argv.index("--seeds") + 1] = "1"
    argv += speed_overrides(args, recipe_of(args)) if args.command != "sweep" else FAST["train"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **({"ACCELERATE_USE_CPU": "1"} if command.launcher else {})}
    launcher = command.launcher or [sys.executable]
    if launcher[0] == "torchrun":
        launcher = [str(Path(sys.executable).with_name("torchrun")), *launcher[1:]]
    done = subprocess.run([*launcher, "-m", "mmrl", *argv], cwd=here, env=env, capture_output=True, text=True,
                          timeout=3600)
    assert done.returncode == 0, f"{command.where}: `{command.text}`:\n{(done.stdout + done.stderr)[-3000:]}"

