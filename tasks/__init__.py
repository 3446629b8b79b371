"""Task adapters (one module per model family), recipes and the demos' synthetic data sets.

Importing this package registers every adapter, tiny model, data set, recipe and demo.
"""

from pathlib import Path

import yaml

from mmrl.train.evaluation import Evaluator
from mmrl.registry import DEMO_EVALUATORS, DEMO_FIGURES, DEMO_SAMPLE_WRITERS, DEMOS, RECIPES

from . import audio_lm, causal_lm, diffusion, dlm, synthetic, tiny_models, vlm  # noqa: F401  (registration)
from .demo_evaluators import boxes_at_iou, exact_match, exact_transcript, tex_match
from .demo_samples import write_samples
from .diffusion.shape_judge import shape_colour_match
from .synthetic import formulas, moving_dot, shapes, spoken_words, tones

RECIPE_DIR = Path(__file__).parent / "recipes"
for _recipe in sorted(RECIPE_DIR.glob("*.yaml")):
    RECIPES.register(_recipe.stem)(str(_recipe))

for _demo, _recipe_name in yaml.safe_load((Path(__file__).parent / "demos.yaml").read_text()).items():
    DEMOS.register(_demo)(_recipe_name)
    DEMO_SAMPLE_WRITERS.register(_demo)(write_samples)  # held-out inputs and outputs as files
DEMO_FIGURES.register("grounding")(shapes.draw_predictions)
DEMO_FIGURES.register("asr")(spoken_words.draw_predictions)
DEMO_FIGURES.register("latex")(formulas.draw_predictions)
DEMO_FIGURES.register("t2i")(diffusion.synthetic.draw_samples)
DEMO_FIGURES.register("video")(moving_dot.draw_predictions)
DEMO_FIGURES.register("audio")(tones.draw_predictions)

# each demo's held-out evaluator: a second judge, never a training reward
DEMO_EVALUATORS.register("text")(exact_match("answer"))
DEMO_EVALUATORS.register("dlm")(exact_match("a"))
DEMO_EVALUATORS.register("latex")(tex_match())
DEMO_EVALUATORS.register("asr")(exact_transcript())
DEMO_EVALUATORS.register("grounding")(boxes_at_iou(0.5))
DEMO_EVALUATORS.register("t2i")(shape_colour_match())
# accuracy of the answer letter; the video's also on its frames shuffled (does the model read their order?)
DEMO_EVALUATORS.register("video")(Evaluator("accuracy of the <answer> letter", exact_match("answer").score,
                                            variants={"shuffled_frames": moving_dot.shuffled_frames}))
DEMO_EVALUATORS.register("audio")(Evaluator("accuracy of the <answer> letter", exact_match("answer").score))
