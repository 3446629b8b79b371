"""The layout of `tasks/`: the adapters never import the demos (`tasks/demos/`).

Every module under tasks/ outside tasks/demos/ is parsed, imports inside functions included, and
so are strings that name a module (a config field's ``"choices": "module:NAME"`` is imported
later). The one exception is the plugin's entry, tasks/__init__.py, which imports `demos` so that
loading the plugin fills the registries the adapters consult (tiny models, pipeline loaders).
"""

from __future__ import annotations

import ast
from pathlib import Path

import mmrl.tasks
import pytest

TASKS = Path(mmrl.tasks.__file__).parent
DEMOS = "mmrl.tasks.demos"
PLUGIN_ENTRY = TASKS / "__init__.py"


def module_name(path: Path) -> str:
    """The dotted name of a module file under tasks/ (a package's __init__ is the package)."""
    parts = ("mmrl", *path.relative_to(TASKS.parent).with_suffix("").parts)  # installed as mmrl.tasks
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source` (at any depth, relative ones
    resolved against `module`), and of every string constant that names a module or a
    ``module:NAME`` reference."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value.partition(":")[0]))
    return found


def demo_imports(path: Path) -> list[str]:
    """'file:line name' for each import of tasks.demos (or a module in it) in the file at `path`."""
    module = module_name(path)
    names = imported_names(path.read_text(), module, path.name == "__init__.py")
    return [f"{path.relative_to(TASKS.parent)}:{line} {name}" for line, name in names
            if name == DEMOS or name.startswith(DEMOS + ".")]


def adapter_modules() -> list[Path]:
    return [p for p in sorted(TASKS.rglob("*.py"))
            if p != PLUGIN_ENTRY and (TASKS / "demos") not in p.parents]


def test_the_adapters_never_import_the_demos():
    modules = adapter_modules()
    assert len(modules) > 20 and TASKS / "lm" / "causal_lm.py" in modules
    offenders = [hit for path in modules for hit in demo_imports(path)]
    assert offenders == [], "an adapter imports the demos:\n" + "\n".join(offenders)


@pytest.mark.parametrize("source", [
    "from mmrl.tasks.demos.tiny_models import char_tokenizer",
    "import mmrl.tasks.demos",
    "def f():\n    from ..demos import tiny_models",
    "def f():\n    from .. import demos",
    "x = {'choices': 'mmrl.tasks.demos.synthetic:SHAPES'}",
])
def test_the_check_sees_every_kind_of_import(source):
    names = imported_names(source, "mmrl.tasks.lm.causal_lm", is_package=False)
    assert any(n == DEMOS or n.startswith(DEMOS + ".") for _, n in names)


def test_relative_imports_resolve_from_the_module_or_the_package():
    assert (1, "mmrl.tasks.model_loading") in imported_names("from ..model_loading import DTYPES", "mmrl.tasks.lm.causal_lm", False)
    assert (1, "mmrl.tasks.diffusion.policy") in imported_names("from . import policy", "mmrl.tasks.diffusion", True)
    assert imported_names("from mmrl.tasks.lm import vlm", "mmrl.tasks.dlm.policy", False) == [
        (1, "mmrl.tasks.lm"), (1, "mmrl.tasks.lm.vlm")]


def test_importing_the_plugin_registers_what_the_demos_provide():
    """The adapters find the demos' tiny models and pixel pipeline loaders in registries; loading
    the plugin (`import tasks`) fills them."""
    from mmrl.tasks.diffusion.loading import PIPELINE_LOADERS
    from mmrl.tasks.model_loading import TINY_MODELS

    assert {"qwen2-char", "dlm-char", "qwen2.5-vl-char", "sd3", "pixel-flow-unet"} <= set(TINY_MODELS.names())
    assert {"PixelFlowPipeline", "PixelFlowUNetPipeline"} <= set(PIPELINE_LOADERS.names())


def test_the_diffusion_adapter_loads_a_saved_pipeline_through_the_loader_its_class_registered(tmp_path, monkeypatch):
    """A model_index.json naming a class with a registered loader goes to that loader; any other
    path (a class diffusers knows, a hub id) to diffusers' `DiffusionPipeline.from_pretrained`."""
    import json

    from mmrl.tasks.diffusion.loading import PIPELINE_LOADERS, diffusers_pipeline, pipeline_loader

    def own_loader(path, dtype):
        return ("own", path, dtype)

    monkeypatch.setitem(PIPELINE_LOADERS._items, "OwnPipeline", own_loader)
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "model_index.json").write_text(json.dumps({"_class_name": "OwnPipeline"}))
    (tmp_path / "stock").mkdir()
    (tmp_path / "stock" / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    assert pipeline_loader(str(tmp_path / "own")) is own_loader
    assert pipeline_loader(str(tmp_path / "stock")) is diffusers_pipeline
    assert pipeline_loader("stabilityai/stable-diffusion-3.5-medium") is diffusers_pipeline


def test_every_package_folder_is_installed_under_the_mmrl_namespace():
    """pyproject.toml lists every package (tasks/ and rewards/ as mmrl.tasks and mmrl.rewards)."""
    import tomllib
    project = tomllib.loads((TASKS.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    where = {name: Path(folder) for name, folder in project["package-dir"].items()}
    folders = set()
    for init in sorted(TASKS.parent.glob("*/**/__init__.py")):
        parts = init.parent.relative_to(TASKS.parent).parts
        if parts[0] in ("mmrl", "tasks", "rewards"):
            root = next((name for name, folder in where.items() if folder.parts == parts[:1]), parts[0])
            folders.add(".".join((root, *parts[1:])))
    assert folders == set(project["packages"])


def test_a_users_own_rewards_and_tasks_modules_do_not_collide(tmp_path):
    """`python -m mmrl list` beside a user's `rewards.py` and `tasks.py` (the obvious names for their
    own files) still finds the project's adapters and rewards."""
    import os
    import subprocess
    import sys
    (tmp_path / "rewards.py").write_text("raise RuntimeError('the user module was imported')\n")
    (tmp_path / "tasks.py").write_text("raise RuntimeError('the user module was imported')\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-m", "mmrl", "list"], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "causal_lm" in done.stdout and "iou" in done.stdout
