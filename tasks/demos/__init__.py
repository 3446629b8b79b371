"""Everything only the embedded demos (`mmrl demo NAME`) and the tests use: tiny random models and
pipelines, the t2i, t2v and edit demos' pixel-space pipelines and judges, the synthetic data sets, the
demos' held-out evaluators, sample writers and figures. Importing it registers them; no adapter
imports this package (they find what it registers in `TINY_MODELS` and `PIPELINE_LOADERS`).
"""

from pathlib import Path

import yaml

from mmrl.registry import DEMO_EVALUATORS, DEMO_FIGURES, DEMO_SAMPLE_WRITERS, DEMOS
from mmrl.train.loop.evaluation import Evaluator

from ..diffusion.loading import PIPELINE_LOADERS
from . import (tiny_diffusion_gemma, tiny_emu3, tiny_generators, tiny_janus, tiny_models, tiny_multimodal, tiny_omni_talker, tiny_pipelines,  # noqa: F401  (registration)
               tiny_speech, tiny_video_generators, tone_codec)
from .evaluators import boxes_at_iou, exact_match, exact_transcript, tex_match, zoom_answers
from .samples import write_samples
from .clip_judge import clip_match
from . import speak_data
from .digit_judge import heldout_intelligibility
from .edit_pair_judge import edit_match
from .shape_judge import shape_colour_match
from .synthetic import colour_shapes, shape_edits, shape_riddles, formulas, moving_dot, moving_shapes, shapes, spoken_words, tones, zoom_patches

# demo name -> recipe name; the file sits at the plugin's root, where `mmrl --help` reads it
# without importing the plugin (mmrl.registry.shipped_demos)
DEMOS_FILE = Path(__file__).parent.parent / "demos.yaml"
for _demo, _recipe_name in yaml.safe_load(DEMOS_FILE.read_text()).items():
    DEMOS.register(_demo)(_recipe_name)
    DEMO_SAMPLE_WRITERS.register(_demo)(write_samples)  # held-out inputs and outputs as files
DEMO_FIGURES.register("grounding")(shapes.draw_predictions)
DEMO_FIGURES.register("asr")(spoken_words.draw_predictions)
DEMO_FIGURES.register("latex")(formulas.draw_predictions)
DEMO_FIGURES.register("t2i")(colour_shapes.draw_samples)
DEMO_FIGURES.register("t2v")(moving_shapes.draw_samples)
DEMO_FIGURES.register("edit")(shape_edits.draw_samples)
DEMO_FIGURES.register("think-draw")(shape_riddles.draw_samples)
DEMO_FIGURES.register("video")(moving_dot.draw_predictions)
DEMO_FIGURES.register("audio")(tones.draw_predictions)
DEMO_FIGURES.register("zoom")(zoom_patches.draw_episodes)
DEMO_FIGURES.register("speak")(speak_data.draw_samples)

# each demo's held-out evaluator: a second judge, never a training reward
DEMO_EVALUATORS.register("text")(exact_match("answer"))
DEMO_EVALUATORS.register("dlm")(exact_match("a"))
DEMO_EVALUATORS.register("latex")(tex_match())
DEMO_EVALUATORS.register("asr")(exact_transcript())
DEMO_EVALUATORS.register("grounding")(boxes_at_iou(0.5))
DEMO_EVALUATORS.register("t2i")(shape_colour_match())
DEMO_EVALUATORS.register("think-draw")(shape_colour_match())
DEMO_EVALUATORS.register("t2v")(clip_match())
DEMO_EVALUATORS.register("edit")(edit_match())
# accuracy of the answer letter; the video's also on its frames shuffled (does the model read their order?)
DEMO_EVALUATORS.register("video")(Evaluator("accuracy of the <answer> letter", exact_match("answer").score,
                                            variants={"shuffled_frames": moving_dot.shuffled_frames}))
DEMO_EVALUATORS.register("zoom")(zoom_answers())
DEMO_EVALUATORS.register("speak")(heldout_intelligibility())
DEMO_EVALUATORS.register("audio")(Evaluator("accuracy of the <answer> letter", exact_match("answer").score))


def pixel_pipeline_loader(class_name: str):
    """The loader of a saved pixel pipeline of class `class_name` (`pixel.py`, imported on first
    use: diffusers is slow to import)."""
    def load(path: str, dtype):
        from . import pixel
        return getattr(pixel, class_name).from_pretrained(path, torch_dtype=dtype)
    return load


for _class_name in ("PixelFlowPipeline", "PixelFlowUNetPipeline", "PixelFlowVideoPipeline", "PixelFlowEditPipeline"):
    PIPELINE_LOADERS.register(_class_name)(pixel_pipeline_loader(_class_name))
