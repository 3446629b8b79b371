"""Task adapters (one module per model family), recipes and the demos' synthetic data sets.

Importing this package registers every adapter, tiny model, data set, recipe and demo.
"""

from pathlib import Path

from mmrl.registry import DEMO_FIGURES, DEMOS, RECIPES

from . import audio, causal_lm, formulas, shapes, speech, text_tasks, tiny_models, tones, vlm  # noqa: F401  (registration)

RECIPE_DIR = Path(__file__).parent / "recipes"
for _recipe in sorted(RECIPE_DIR.glob("*.yaml")):
    RECIPES.register(_recipe.stem)(str(_recipe))

DEMOS.register("text")("text_demo")
DEMOS.register("grounding")("grounding")
DEMO_FIGURES.register("grounding")(shapes.draw_predictions)
DEMOS.register("asr")("asr")
DEMO_FIGURES.register("asr")(speech.draw_predictions)
