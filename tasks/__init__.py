"""Task adapters (one module per model family), recipes and the demos' synthetic data sets.

Importing this package registers every adapter, tiny model, data set, recipe and demo.
"""

from pathlib import Path

import yaml

from mmrl.registry import DEMO_FIGURES, DEMOS, RECIPES

from . import audio_lm, causal_lm, diffusion, dlm, synthetic, tiny_models, vlm  # noqa: F401  (registration)
from .synthetic import formulas, moving_dot, shapes, spoken_words, tones

RECIPE_DIR = Path(__file__).parent / "recipes"
for _recipe in sorted(RECIPE_DIR.glob("*.yaml")):
    RECIPES.register(_recipe.stem)(str(_recipe))

for _demo, _recipe_name in yaml.safe_load((Path(__file__).parent / "demos.yaml").read_text()).items():
    DEMOS.register(_demo)(_recipe_name)
DEMO_FIGURES.register("grounding")(shapes.draw_predictions)
DEMO_FIGURES.register("asr")(spoken_words.draw_predictions)
DEMO_FIGURES.register("latex")(formulas.draw_predictions)
DEMO_FIGURES.register("t2i")(diffusion.synthetic.draw_samples)
DEMO_FIGURES.register("video")(moving_dot.draw_predictions)
DEMO_FIGURES.register("audio")(tones.draw_predictions)
