"""Name -> object registries, filled by plugin modules found through entry points.

The engine never imports `tasks` or `rewards` by name: `load_plugins()` imports every module
declared under the ``mmrl.plugins`` entry-point group (ours and any third party's), and their
decorators fill the registries below.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Callable, Generic, Iterator, TypeVar

from mmrl.errors import MissingFileError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection; unknown names fail with the list of known ones."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name not in self._items:  # plugins are imported only when a name is not yet known
            load_plugins()
        if name not in self._items:
            known = ", ".join(sorted(self._items)) or "none"
            close = difflib.get_close_matches(str(name), list(self._items), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KeyError(f"unknown {self.kind} {name!r}{hint}; registered: {known}")
        return self._items[name]

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """(name, object) pairs in registration order, as registered so far (plugins are not
        loaded: for registries whose order matters, e.g. terms added to a loss)."""
        return list(self._items.items())

    def __contains__(self, name: str) -> bool:
        load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


_plugins_loaded = False


def load_plugins() -> None:
    """Import every module registered under the ``mmrl.plugins`` entry-point group, once."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group="mmrl.plugins"):
        ep.load()


def _plugin_dirs() -> list[Path]:
    """The folders of the plugin packages, found WITHOUT importing them (for fast `mmrl --help`; a
    plugin inside a package, ``mmrl.tasks``, imports only its parent package, here the light ``mmrl``)."""
    dirs = []
    for ep in entry_points(group="mmrl.plugins"):
        try:
            spec = importlib.util.find_spec(ep.module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            dirs += [Path(p) for p in spec.submodule_search_locations]
    return dirs


def shipped_recipes() -> dict[str, Path]:
    """Recipe name -> YAML file of every plugin's ``recipes/*.yaml``, without importing plugins."""
    return {p.stem: p for d in _plugin_dirs() for p in sorted((d / "recipes").glob("*.yaml"))}


def shipped_demos() -> dict[str, str]:
    """Demo name -> recipe name from every plugin's ``demos.yaml``, without importing plugins."""
    import yaml
    out: dict[str, str] = {}
    for d in _plugin_dirs():
        if (d / "demos.yaml").is_file():
            out.update(yaml.safe_load((d / "demos.yaml").read_text()) or {})
    return out


def import_user_module(spec: str, key: str) -> ModuleType:
    """Import a user's file (``my_rewards.py``) or module (``pkg.rewards``) so it can register;
    return the module (a file is imported once). `key`: the recipe key or option that named it
    (``reward_modules``, ``policy.episode.tool_modules``, ...), which a missing file's error names."""
    path = Path(spec)
    if spec.endswith(".py"):
        if not path.is_file():
            raise MissingFileError(f"{key}: file {spec!r} does not exist (relative to {Path.cwd()})")
        name = f"mmrl_user_{path.stem}_{abs(hash(str(path.resolve())))}"
        if name in sys.modules:
            return sys.modules[name]
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        return module
    return importlib.import_module(spec)


# The registries every room uses.
ADAPTERS: Registry = Registry("task adapter")
DATASETS: Registry = Registry("dataset")
DEMOS: Registry = Registry("demo")
RECIPES: Registry = Registry("recipe")
TOOLS: Registry = Registry("tool")  # a typed Python function with a docstring that an episode may call (docs/episodes.md)
DEMO_FIGURES: Registry = Registry("demo figure")  # fn(rows, greedy_before, greedy_after, out_png)
DEMO_EVALUATORS: Registry = Registry("demo evaluator")  # mmrl.train.loop.evaluation.Evaluator: a held-out judge, never a reward
DEMO_SAMPLE_WRITERS: Registry = Registry("demo sample writer")  # fn(samples, folder): held-out inputs and outputs as files
BENCHMARKS: Registry = Registry("benchmark")  # mmrl.core.benchmark.Benchmark: data source, generation, scorer (docs/bench.md)
