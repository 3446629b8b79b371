"""Recipe lookup: a path to a YAML file, or the name of a recipe a plugin ships or registers.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from mmrl.errors import UserError
from mmrl.registry import (
    RECIPES,  # a third-party plugin may register recipes in code
    shipped_recipes,
)


def resolve_recipe(name_or_path: str) -> Path:
    """A path to a ``.yaml``/``.yml`` file, else the name of a shipped (or plugin-registered) recipe;
    a file or folder that happens to carry a recipe's name does not hide it."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise UserError(f"recipe file {name_or_path!r} does not exist")
        return path
    shipped = shipped_recipes()
    if name_or_path in shipped:
        return shipped[name_or_path]
    if name_or_path in RECIPES:
        return Path(RECIPES.get(name_or_path))
    close = difflib.get_close_matches(name_or_path, list(shipped), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UserError(f"unknown recipe {name_or_path!r}{hint}; shipped recipes: {', '.join(sorted(shipped)) or 'none'} "
                    "(or give a path to a .yaml file)")
