"""Task adapters (one package per model family: `lm`, `diffusion`, `dlm`, `speech`, `ar_image`; `composite`, a policy made of two of them),
their recipes, the
built-in benchmarks (`bench`), and the demos (`demos`: everything only the embedded demos and the tests use).

Importing this package registers every adapter and recipe, and through `demos` every tiny model,
synthetic data set, demo and demo evaluator. The adapters never import `demos` (tests/test_layout.py):
they find its tiny models and pipeline loaders in registries, which this plugin entry fills.
"""

from pathlib import Path

from mmrl.registry import RECIPES

from . import (  # noqa: F401  (registration)
    ar_image,
    composite,
    demos,  # noqa: F401  (registration; builds on the adapters above)
    diffusion,
    dlm,
    lm,
    speech,
)
from . import bench  # noqa: F401,E402  (registration: the built-in benchmarks, on the adapters above)

RECIPE_DIR = Path(__file__).parent / "recipes"
for _recipe in sorted(RECIPE_DIR.glob("*.yaml")):
    RECIPES.register(_recipe.stem)(str(_recipe))
