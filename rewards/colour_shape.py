"""Colour and shape agreement of a generated image with a "<colour> <shape>" prompt, in [0, 1],
computed from the pixels (an offline reward for the t2i demo and tests).

Each pixel is given the nearest palette colour (the prompt colours and the background). With
f the fraction of pixels of the prompt's colour and [lo, hi] = `area` the share a drawn shape
covers,
    colour = min(1, f / lo) for f <= hi,   max(0, (2 hi - f) / hi) above (painting the whole
             canvas in the colour scores 0)
The shape is judged on the bounding box (h x w) of those pixels: its inscribed ellipse E (as PIL
draws a disc, the synthetic data's convention) and its corners C (the box outside E). With a the
share of E and b the share of C that the pixels cover,
    shape = a (1 - b) for a circle,   a b for a square,   times min(h, w) / max(h, w)
so a perfect disc asked to be a square (or the reverse) scores 0 on shape, a ragged blob or
scattered pixels score in between (a graded signal for RL from a random model on), and a long
bar loses by its aspect ratio (0 when fewer than 4 pixels, or when the box is too thin, 1 or 2
pixels, to have corners).
    reward = (colour + colour * shape) / 2
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmrl.core.scoring import register_reward

from .outputs import IMAGE
from .video_frames import per_frame

PALETTE = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 40),
           "background": (245, 245, 245)}
SHAPES = ("circle", "square")


def colour_problem(colour: Any, **args) -> str | None:
    """What is wrong with a row's `colour` (checked before any model loads, and at each call)."""
    if colour not in PALETTE or colour == "background":
        return f"colour_shape: colour {colour!r} is not one of {sorted(set(PALETTE) - {'background'})}"
    return None


def shape_problem(shape: Any, **args) -> str | None:
    """What is wrong with a row's `shape`."""
    return None if shape in SHAPES else f"colour_shape: shape {shape!r} is not one of {list(SHAPES)}"


def colour_shape_score(image, colour: str, shape: str, area: tuple[float, float] = (0.08, 0.4)) -> float:
    if problem := colour_problem(colour) or shape_problem(shape):
        raise ValueError(problem)
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    names = list(PALETTE)
    palette = np.array([PALETTE[n] for n in names], dtype=np.float32)
    nearest = ((pixels[:, :, None, :] - palette) ** 2).sum(-1).argmin(-1)
    mine = nearest == names.index(colour)
    lo, hi = area
    f = float(mine.mean())
    colour_score = min(1.0, f / lo) if f <= hi else max(0.0, (2 * hi - f) / hi)
    if mine.sum() < 4:
        return colour_score / 2
    ys, xs = np.nonzero(mine)
    top, left = ys.min(), xs.min()
    h, w = ys.max() - top + 1, xs.max() - left + 1
    drawn = mine[top:top + h, left:left + w]
    ellipse = inscribed_ellipse(h, w)
    if ellipse.all() or not ellipse.any():
        return colour_score / 2
    inside, corners = float(drawn[ellipse].mean()), float(drawn[~ellipse].mean())
    shape_score = inside * (1 - corners if shape == "circle" else corners) * min(h, w) / max(h, w)
    return (colour_score + colour_score * shape_score) / 2


def inscribed_ellipse(h: int, w: int) -> np.ndarray:
    """[h, w] bool: the ellipse inscribed in an h x w box, rasterised by PIL as the synthetic
    data draws its discs (at a few pixels a side rasterisations differ; this one is the data's)."""
    from PIL import Image, ImageDraw
    image = Image.new("1", (int(w), int(h)), 0)
    ImageDraw.Draw(image).ellipse([0, 0, int(w) - 1, int(h) - 1], fill=1)
    return np.asarray(image, dtype=bool)


@register_reward("colour_shape", outputs=IMAGE, check_columns={"colour": colour_problem, "shape": shape_problem})
@per_frame(columns=("colour", "shape"))
def colour_shape(prompts, completions, colour, shape, area: tuple[float, float] = (0.08, 0.4), **columns):
    """Needs the data set's `colour` and `shape` columns (the `colour_shapes` data set has them)."""
    return [colour_shape_score(img, c, s, tuple(area)) for img, c, s in zip(completions, colour, shape)]


def colour_shape_preference(a, b, colour: str, shape: str, area: tuple[float, float] = (0.08, 0.4)) -> float:
    """A pairwise judge made from the colour_shape score, for `win_rate` (`prefer:
    mmrl.rewards.colour_shape:colour_shape_preference`; the group's `colour` and `shape` columns are
    passed in, `area` as colour_shape's, from `prefer_args`): 1 if image `a` scores higher, 0 if
    lower, 0.5 on a tie, as Pref-GRPO's judge answers "Image 1 is better" / "Image 2 is better" /
    neither."""
    sa, sb = colour_shape_score(a, colour, shape, tuple(area)), colour_shape_score(b, colour, shape, tuple(area))
    return 1.0 if sa > sb else 0.0 if sa < sb else 0.5
