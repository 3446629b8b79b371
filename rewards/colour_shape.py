"""Colour and shape agreement of a generated image with a "<colour> <shape>" prompt, in [0, 1],
computed from the pixels (an offline reward for the t2i demo and tests).

Each pixel is given the nearest palette colour (the prompt colours and the background). With
f the fraction of pixels of the prompt's colour and [lo, hi] = `area` the share a drawn shape
covers,
    colour = min(1, f / lo) for f <= hi,   max(0, (2 hi - f) / hi) above (painting the whole
             canvas in the colour scores 0)
and, on the bounding box of those pixels, with fill = (pixels of the colour) / (box area)
(pi / 4 for a disc, 1 for a square),
    shape = max(0, 1 - |fill - fill_expected| / fill_expected)   (0 when fewer than 4 pixels)
    reward = (colour + colour * shape) / 2
"""

from __future__ import annotations

import math

import numpy as np

from mmrl.reward_registry import register_reward

PALETTE = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 40),
           "background": (245, 245, 245)}
FILL = {"circle": math.pi / 4, "square": 1.0}


def colour_shape_score(image, colour: str, shape: str, area: tuple[float, float] = (0.08, 0.4)) -> float:
    if colour not in PALETTE or colour == "background":
        raise ValueError(f"colour_shape: colour {colour!r} is not one of {sorted(set(PALETTE) - {'background'})}")
    if shape not in FILL:
        raise ValueError(f"colour_shape: shape {shape!r} is not one of {sorted(FILL)}")
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
    box = (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1)
    fill = float(mine.sum()) / float(box)
    shape_score = max(0.0, 1.0 - abs(fill - FILL[shape]) / FILL[shape])
    return (colour_score + colour_score * shape_score) / 2


@register_reward("colour_shape")
def colour_shape(prompts, completions, colour=None, shape=None, area: tuple[float, float] = (0.08, 0.4),
                 **columns):
    """Needs the data set's `colour` and `shape` columns (the `colour_shapes` data set has them)."""
    if colour is None or shape is None:
        raise ValueError("colour_shape needs the data columns 'colour' and 'shape'")
    return [colour_shape_score(img, c, s, tuple(area)) for img, c, s in zip(completions, colour, shape)]
