"""The demos' synthetic data sets, made in code (no downloads): text tasks, shapes for grounding,
spoken digit words, tone pairs, moving-dot clips, rendered formulas, coloured shapes to draw and to edit, dots to zoom into."""

from . import colour_shapes, formulas, moving_dot, shape_edits, shape_riddles, shapes, spoken_words, text_tasks, tones, zoom_patches  # noqa: F401  (registration)
