"""The engine's layers (docs/architecture.md): each module of `mmrl/` imports only its own layer and
the layers below it, function-level imports included, and the engine imports no adapter or reward."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "mmrl"
# lowest first; a module may import its own layer and any layer before it
LAYERS = [("mmrl.errors", "mmrl.registry", "mmrl.sandbox"), ("mmrl.config",), ("mmrl.core",), ("mmrl.data",),
          ("mmrl.distributed",), ("mmrl.serving",), ("mmrl.train",), ("mmrl.experiments",), ("mmrl.cli",)]
ENTRY = ("mmrl", "mmrl.__main__")  # the package's lazy public names and `python -m mmrl` may import any layer


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int | None:
    for level, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return None


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, wherever it stands."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            # `from mmrl.train import checkpoint` imports the module mmrl.train.safety.checkpoint
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
            found.append((node.lineno, module))
    return found


def engine_files() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def test_every_engine_module_has_a_layer():
    homeless = [module_name(p) for p in engine_files() if module_name(p) not in ENTRY and layer_of(module_name(p)) is None]
    assert not homeless, f"modules outside the layers {LAYERS}: {homeless}"


@pytest.mark.parametrize("path", engine_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path: Path):
    here = module_name(path)
    if here in ENTRY:
        return
    level = layer_of(here)
    upward = []
    for line, module in imported_modules(path):
        if module.split(".")[0] in ("tasks", "rewards") or module.startswith(("mmrl.tasks", "mmrl.rewards")):
            upward.append(f"line {line}: {module} (the engine finds adapters and rewards through registries)")
            continue
        target = layer_of(module)
        if target is not None and target > level:
            upward.append(f"line {line}: {module} (layer {LAYERS[target][0]} is above {LAYERS[level][0]})")
    assert not upward, f"{here} imports upward:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """The check itself: a core module importing the trainer inside a function is caught."""
    bad = ENGINE / "core" / "_layer_probe.py"
    bad.write_text("def f():\n    from mmrl.train.loop.trainer import Trainer\n    return Trainer\n")
    try:
        with pytest.raises(AssertionError, match="mmrl.train.loop.trainer"):
            test_imports_point_down(bad)
    finally:
        bad.unlink()


# the rooms of mmrl/train/, lowest first: a module may import its own room and the rooms before it
TRAIN_ROOMS = ["mmrl.train.reporting", "mmrl.train.safety", "mmrl.train.placement", "mmrl.train.plan", "mmrl.train.loop"]


def room_of(module: str) -> int | None:
    return next((i for i, room in enumerate(TRAIN_ROOMS) if module == room or module.startswith(room + ".")), None)


TRAIN_FILES = [p for p in engine_files() if ENGINE / "train" in p.parents]


def test_every_train_module_is_in_a_room():
    """mmrl/train/ holds its rooms (sub-packages) and nothing else but its own `__init__`."""
    loose = [module_name(p) for p in TRAIN_FILES if module_name(p) != "mmrl.train" and room_of(module_name(p)) is None]
    assert not loose, f"modules of mmrl/train/ outside the rooms {TRAIN_ROOMS}: {loose}"


@pytest.mark.parametrize("path", TRAIN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_rooms_of_train_import_one_way(path: Path):
    room = room_of(module_name(path))
    if room is None:
        return
    upward = [f"line {line}: {module} (room {TRAIN_ROOMS[target]} is above {TRAIN_ROOMS[room]})"
              for line, module in imported_modules(path)
              if (target := room_of(module)) is not None and target > room]
    assert not upward, f"{module_name(path)} imports a room above its own:\n" + "\n".join(upward)


def test_the_check_sees_a_room_importing_upward():
    bad = ENGINE / "train" / "safety" / "_room_probe.py"
    bad.write_text("def f():\n    from mmrl.train.loop.parts import build_parts\n    return build_parts\n")
    try:
        with pytest.raises(AssertionError, match="room mmrl.train.loop is above mmrl.train.safety"):
            test_the_rooms_of_train_import_one_way(bad)
    finally:
        bad.unlink()


STRATEGY_NAMES = {"ddp", "fsdp", "zero3"}
CHOICES = ENGINE / "config" / "sections.py"  # the recipe's `distributed.strategy` choices and their help
OUTSIDE_DISTRIBUTED = [p for root in ("mmrl", "tasks", "rewards") for p in sorted((ROOT / root).rglob("*.py"))
                       if ENGINE / "distributed" not in p.parents and p != CHOICES]


def strategy_mentions(path: Path) -> list[str]:
    """Code that names a strategy: an identifier, an attribute or a string that is exactly a strategy's
    name (comments and prose do not count), or an import of mmrl.distributed."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
        if name in STRATEGY_NAMES:
            found.append(f"line {node.lineno}: {name!r}")
    if ENGINE not in path.parents:  # adapters and rewards get the distribution through Policy.parallel
        found += [f"line {line}: imports {m}" for line, m in imported_modules(path) if m.startswith("mmrl.distributed")]
    return found


@pytest.mark.parametrize("path", OUTSIDE_DISTRIBUTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_strategy_is_named_only_in_mmrl_distributed(path: Path):
    found = strategy_mentions(path)
    assert not found, f"{path.relative_to(ROOT)} names a distribution strategy:\n" + "\n".join(found)


def test_the_check_sees_a_strategy_branch_and_an_adapter_import():
    probe = ROOT / "tasks" / "_strategy_probe.py"
    probe.write_text("def f(cfg):\n    from mmrl.distributed.fsdp import Sharding\n    return cfg.strategy == 'zero3'\n")
    try:
        assert set(strategy_mentions(probe)) == {"line 3: 'zero3'", "line 2: imports mmrl.distributed.fsdp",
                                                 "line 2: imports mmrl.distributed.fsdp.Sharding"}
    finally:
        probe.unlink()


STRATEGY_PROSE = re.compile(r"(?i:\b(ddp|fsdp2?|zero-?3|deepspeed)\b)|\bZeRO\b")
@pytest.mark.parametrize("path", OUTSIDE_DISTRIBUTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_strategy_is_named_outside_distributed_even_in_prose(path: Path):
    """Docstrings, comments, help text and messages outside mmrl/distributed/ (the recipe's
    `distributed.strategy` help excepted) say "a strategy that shards parameters"; adapters ask
    `Policy.parallel` (its `description` where a message must say which)."""
    found = [f"line {n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
             if STRATEGY_PROSE.search(line)]
    assert not found, f"{path.relative_to(ROOT)} names a distribution strategy:\n" + "\n".join(found)
