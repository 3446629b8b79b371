"""The t2i demo's held-out judge (a CNN trained on clean synthetic drawings, never a reward):
it tells circles from squares and the four colours apart on held-out clean images."""

import random

import pytest
from mmrl.tasks.demos.shape_judge import COLOUR_NAMES, labelled_images, shape_colour_match, train_judge
from mmrl.tasks.demos.synthetic.colour_shapes import SHAPES, draw_shape


@pytest.fixture(scope="module")
def judge():
    return train_judge(size=16, seed=0)


def test_the_judge_separates_shapes_and_colours_on_held_out_clean_images(judge):
    rng = random.Random(12345)  # not the training seed: other drawings
    truth = [(c, s) for c in COLOUR_NAMES for s in SHAPES for _ in range(40)]
    images = [draw_shape(c, s, 16, rng) for c, s in truth]
    colours, shapes = judge.predict(images)
    shape_acc = sum(p == s for p, (_, s) in zip(shapes, truth)) / len(truth)
    colour_acc = sum(p == c for p, (c, _) in zip(colours, truth)) / len(truth)
    assert shape_acc >= 0.9 and colour_acc >= 0.9, (shape_acc, colour_acc)
    # circles and squares separately: neither class is the judge's default answer
    for name in SHAPES:
        picked = [p for p, (_, s) in zip(shapes, truth) if s == name]
        assert sum(p == name for p in picked) / len(picked) >= 0.9, name


def test_scattered_pixels_are_not_a_shape(judge):
    images, _, shape_idx = labelled_images(400, 16, random.Random(7))
    scattered = [im for im, s in zip(images, shape_idx) if s == 2]
    _, shapes = judge.predict(scattered)
    assert len(scattered) > 40 and sum(s == "none" for s in shapes) / len(shapes) >= 0.9


def test_the_evaluator_scores_both_right(monkeypatch, judge):
    import mmrl.tasks.demos.shape_judge as module
    monkeypatch.setattr(module, "shape_judge", lambda size, seed: judge)
    rng = random.Random(3)
    red_circle = draw_shape("red", "circle", 16, rng)
    scores = shape_colour_match().score(None, [red_circle] * 3, colour=["red", "blue", "red"],
                                        shape=["circle", "circle", "square"])
    assert scores == [1.0, 0.0, 0.0]


def test_the_judge_trains_inside_evaluation_no_grad():
    """Its first use is inside `evaluate` (no_grad): training must still get gradients."""
    import torch
    with torch.no_grad():
        trained = train_judge(size=16, seed=1, n=64, steps=2, batch=8)
    fresh = train_judge(size=16, seed=1, n=64, steps=0, batch=8)
    moved = [not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), fresh.state_dict().values())]
    assert any(moved)
