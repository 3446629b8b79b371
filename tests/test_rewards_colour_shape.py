"""The colour_shape pixel reward on hand-drawn images."""

import random

import numpy as np
import pytest
from mmrl.rewards.colour_shape import colour_shape, colour_shape_score, inscribed_ellipse
from mmrl.tasks.demos.synthetic.colour_shapes import BACKGROUND, COLOURS, draw_shape
from PIL import Image, ImageDraw


def test_targets_score_high_and_hacks_score_low():
    rng = random.Random(0)
    for colour in COLOURS:
        for shape in ("circle", "square"):
            assert colour_shape_score(draw_shape(colour, shape, 32, rng), colour, shape) > 0.8
    square = Image.new("RGB", (32, 32), BACKGROUND)
    ImageDraw.Draw(square).rectangle([4, 4, 17, 17], fill=COLOURS["red"])      # 14 x 14: f = 0.19
    assert colour_shape_score(square, "red", "square") == pytest.approx(1.0)
    assert colour_shape_score(square, "blue", "square") == 0.0                 # wrong colour
    assert colour_shape_score(square, "red", "circle") == 0.5                  # a perfect square is no circle
    disc = Image.new("RGB", (32, 32), BACKGROUND)
    ImageDraw.Draw(disc).ellipse([4, 4, 17, 17], fill=COLOURS["red"])
    assert colour_shape_score(disc, "red", "circle") == pytest.approx(1.0)
    assert colour_shape_score(disc, "red", "square") == 0.5
    bar = Image.new("RGB", (32, 32), BACKGROUND)
    ImageDraw.Draw(bar).rectangle([4, 4, 23, 8], fill=COLOURS["red"])           # 20 x 5: f = 0.098, aspect 1/4
    assert colour_shape_score(bar, "red", "square") == pytest.approx(0.5 + 0.5 * 0.25)
    chipped = Image.new("RGB", (32, 32), BACKGROUND)                            # a square missing a 3 x 3 corner
    ImageDraw.Draw(chipped).rectangle([4, 4, 17, 17], fill=COLOURS["red"])
    ImageDraw.Draw(chipped).rectangle([15, 15, 17, 17], fill=BACKGROUND)
    mask = np.ones((14, 14), bool)
    mask[11:, 11:] = False
    disc = inscribed_ellipse(14, 14)
    a, b = mask[disc].mean(), mask[~disc].mean()
    assert 0.7 < b < 1 and a > 0.95
    assert colour_shape_score(chipped, "red", "square") == pytest.approx(0.5 + 0.5 * a * b)
    assert colour_shape_score(chipped, "red", "circle") == pytest.approx(0.5 + 0.5 * a * (1 - b))
    scattered = Image.new("RGB", (32, 32), BACKGROUND)
    for x, y in ((0, 0), (24, 24), (0, 24), (24, 0)):                            # 4 squares of 8 x 8: fill 0.25
        ImageDraw.Draw(scattered).rectangle([x, y, x + 7, y + 7], fill=COLOURS["red"])
    mask = np.zeros((32, 32), bool)
    for x, y in ((0, 0), (24, 24), (0, 24), (24, 0)):
        mask[y:y + 8, x:x + 8] = True
    disc = inscribed_ellipse(32, 32)
    a, b = mask[disc].mean(), mask[~disc].mean()
    assert a < 0.1 and b > 0.5                                                  # the corners, not the disc
    assert colour_shape_score(scattered, "red", "square") == pytest.approx(0.5 + 0.5 * a * b)
    assert colour_shape_score(Image.new("RGB", (32, 32), COLOURS["red"]), "red", "square") == 0.0  # whole canvas
    assert colour_shape_score(Image.new("RGB", (32, 32), BACKGROUND), "red", "square") == 0.0
    small = Image.new("RGB", (32, 32), BACKGROUND)
    ImageDraw.Draw(small).rectangle([0, 0, 4, 4], fill=COLOURS["red"])         # f = 25/1024, below lo
    assert colour_shape_score(small, "red", "square") == pytest.approx(25 / 1024 / 0.08)


def test_reward_reads_the_columns_and_names_bad_values():
    image = Image.new("RGB", (8, 8), BACKGROUND)
    assert colour_shape(["p"], [image], colour=["red"], shape=["square"]) == [0.0]
    with pytest.raises(TypeError, match="'colour' and 'shape'"):
        colour_shape(["p"], [image])
    with pytest.raises(ValueError, match="'purple'"):
        colour_shape(["p"], [image], colour=["purple"], shape=["square"])

