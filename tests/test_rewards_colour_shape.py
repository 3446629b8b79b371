"""The colour_shape pixel reward on hand-drawn images."""

import random

import pytest
from PIL import Image, ImageDraw

from rewards.colour_shape import colour_shape, colour_shape_score
from tasks.diffusion.synthetic import BACKGROUND, COLOURS, draw_shape


def test_targets_score_high_and_hacks_score_low():
    rng = random.Random(0)
    for colour in COLOURS:
        for shape in ("circle", "square"):
            assert colour_shape_score(draw_shape(colour, shape, 32, rng), colour, shape) > 0.8
    square = Image.new("RGB", (32, 32), BACKGROUND)
    ImageDraw.Draw(square).rectangle([4, 4, 17, 17], fill=COLOURS["red"])      # 14 x 14: f = 0.19
    assert colour_shape_score(square, "red", "square") == pytest.approx(1.0)
    assert colour_shape_score(square, "blue", "square") == 0.0                 # wrong colour
    fill_circle = 3.14159265 / 4
    assert colour_shape_score(square, "red", "circle") == pytest.approx(0.5 + 0.5 * (1 - (1 - fill_circle) / fill_circle))
    scattered = Image.new("RGB", (32, 32), BACKGROUND)
    for x, y in ((0, 0), (24, 24), (0, 24), (24, 0)):                            # 4 squares of 8 x 8: fill 0.25
        ImageDraw.Draw(scattered).rectangle([x, y, x + 7, y + 7], fill=COLOURS["red"])
    assert colour_shape_score(scattered, "red", "square") == pytest.approx(0.5 + 0.5 * 0.25)
    assert colour_shape_score(Image.new("RGB", (32, 32), COLOURS["red"]), "red", "square") == 0.0  # whole canvas
    assert colour_shape_score(Image.new("RGB", (32, 32), BACKGROUND), "red", "square") == 0.0
    small = Image.new("RGB", (32, 32), BACKGROUND)
    ImageDraw.Draw(small).rectangle([0, 0, 4, 4], fill=COLOURS["red"])         # f = 25/1024, below lo
    assert colour_shape_score(small, "red", "square") == pytest.approx(25 / 1024 / 0.08)


def test_reward_reads_the_columns_and_names_bad_values():
    image = Image.new("RGB", (8, 8), BACKGROUND)
    assert colour_shape(["p"], [image], colour=["red"], shape=["square"]) == [0.0]
    with pytest.raises(ValueError, match="'colour' and 'shape'"):
        colour_shape(["p"], [image])
    with pytest.raises(ValueError, match="'purple'"):
        colour_shape(["p"], [image], colour=["purple"], shape=["square"])
