"""The edit demo's parts: the `edit_shift` reward against hand-built shifts and the synthetic
edits' own moves, the pixel editing family (the source image reaches the denoiser in rollouts
and in the warm start; a recipe without `policy.image_column` is refused), the held-out pair judge
(names colour, shape and motion of clean edit pairs it has not seen; the evaluator needs all
three) and the figure."""

import random

import numpy as np
import pytest
import torch
from mmrl.rewards.edit_shift import edit_shift, measured_shift, shift_problem
from mmrl.tasks.demos.synthetic.colour_shapes import COLOURS, SHAPES
from mmrl.tasks.demos.synthetic.shape_edits import MOVES, edit_row, shape_edits
from PIL import Image


def _square_at(x: int, y: int, size: int = 16, side: int = 5) -> Image.Image:
    """A grey square with its top-left corner at (x, y), drawn with numpy (not the data's PIL code)."""
    pixels = np.full((size, size, 3), 245, np.uint8)
    pixels[y:y + side, x:x + side] = (40, 80, 220)
    return Image.fromarray(pixels)


def test_edit_shift_measures_a_hand_made_move_and_scores_its_error():
    source, edit = _square_at(3, 8), _square_at(6, 6)  # moved by (dx, dy) = (3, -2)
    assert torch.allclose(measured_shift(source, edit), torch.tensor([3.0, -2.0]), atol=0.1)
    scores = edit_shift(None, [edit, edit, source], image=[source] * 3, shift=[[3, -2], [0, 0], [4, 0]])
    # by hand: error 0 -> 1;  |(3, -2)| = 3.606 -> 1 - 3.606 / 4;  a copy asked to move 4 right: 1 - 4 / 4
    assert scores == pytest.approx([1.0, 1 - 13 ** 0.5 / 4, 0.0], abs=0.03)
    assert edit_shift(None, [edit], image=[source], shift=[[0, 0]], tolerance=8.0) == pytest.approx(
        [1 - 13 ** 0.5 / 8], abs=0.02)


def test_edit_shift_reads_the_synthetic_edits_moves():
    rng = random.Random(11)
    rows = [edit_row(16, rng, kind) for kind in ("move", "recolour") for _ in range(20)]
    targets = [r["target"] for r in rows]
    scores = edit_shift(None, targets, image=[r["image"] for r in rows], shift=[r["shift"] for r in rows])
    assert min(scores) >= 0.9, scores
    copies = edit_shift(None, [r["image"] for r in rows[:20]], image=[r["image"] for r in rows[:20]],
                        shift=[r["shift"] for r in rows[:20]])
    assert max(copies) <= 0.05  # a move of a quarter of the side (4 pixels) left undone


def test_the_shift_column_and_tolerance_are_checked():
    assert shift_problem([1, -2]) is None
    for bad in ("left", [1], [1, "2"], None, [True, 0]):
        assert "is not a pair of numbers" in shift_problem(bad)
    with pytest.raises(ValueError, match="tolerance=0"):
        edit_shift(None, [], image=[], shift=[], tolerance=0)


def test_the_rows_name_their_motion_and_shift():
    for row in shape_edits(n_train=40, n_eval=8, size=16, seed=0)["train"]:
        if row["edit"] == "move":
            assert row["prompt"] == f"move the {row['shape']} {row['motion']}"
            assert row["shift"] == [4 * d for d in MOVES[row["motion"]]]
        else:
            assert (row["motion"], row["shift"]) == ("still", [0, 0])


def _policy(**kw):
    from mmrl.tasks.diffusion.config import DiffusionConfig
    from mmrl.tasks.diffusion.policy import DiffusionPolicy
    args = dict(model="tiny:pixel-flow-edit", tiny_args={"channels": [16, 32]}, height=16, width=16,
                image_column="image", num_steps=3, eval_num_steps=2, classifier_free_guidance=False,
                guidance_scale=1.0, sampler="flow_sde", noise_level=0.7)
    return DiffusionPolicy(DiffusionConfig(**{**args, **kw}))


def test_the_source_image_conditions_the_rollout():
    policy = _policy()
    rows = shape_edits(n_train=2, n_eval=1, size=16, seed=0)["train"]
    other = {**rows[0], "image": rows[1]["image"]}  # same instruction, another source
    first, second = (policy.rollout([r], group_size=2, seeds=[0], greedy=True) for r in (rows[0], other))
    assert first.completions[0].size == (16, 16)
    a, b = (np.asarray(r.completions[0], np.int16) for r in (first, second))
    assert np.abs(a - b).max() > 0


def test_the_warm_start_loss_reads_the_source():
    policy = _policy()
    rows = shape_edits(n_train=8, n_eval=1, size=16, seed=0)["train"]
    swapped = [{**r, "image": rows[(i + 1) % len(rows)]["image"]} for i, r in enumerate(rows)]
    losses = []
    for batch in (rows, swapped):
        torch.manual_seed(0)
        losses.append(policy.supervised_loss(policy.model, batch, "target"))
    assert losses[0].item() != losses[1].item()  # same noise and targets: only the sources differ
    losses[0].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.model.parameters())


def test_an_editing_recipe_without_its_image_column_is_refused():
    with pytest.raises(ValueError, match="policy.image_column is not set"):
        _policy(image_column="")


@pytest.fixture(scope="module")
def judge():
    from mmrl.tasks.demos.edit_pair_judge import edit_pair_judge
    return edit_pair_judge(16, 2)  # cached after its first training (~1-3 min on 2 loaded cores)


@pytest.mark.slow  # trains the judge where it is not cached: 1-3 min on 2 loaded cores (2026-11-29)
def test_the_judge_names_colour_shape_and_motion_of_unseen_clean_pairs(judge):
    rng = random.Random(4321)  # not the judge's training seed
    rows = [edit_row(16, rng) for _ in range(400)]
    colours, shapes, motions = judge.predict([[r["image"], r["target"]] for r in rows])
    for got, key in ((colours, "colour"), (shapes, "shape"), (motions, "motion")):
        assert sum(g == r[key] for g, r in zip(got, rows)) / len(rows) >= 0.9, key
    _, _, still = judge.predict([[r["image"], r["image"]] for r in rows])  # an edit that copies its source
    assert sum(m == "still" for m in still) / len(rows) >= 0.9


@pytest.mark.slow  # the judge, as above
def test_the_evaluator_needs_colour_shape_and_motion_right(monkeypatch, judge):
    import mmrl.tasks.demos.edit_pair_judge as module
    from mmrl.tasks.demos.edit_pair_judge import edit_match
    monkeypatch.setattr(module, "edit_pair_judge", lambda size, seed: judge)
    row = edit_row(16, random.Random(9), "move")
    other_colour = next(c for c in COLOURS if c != row["colour"])
    other_shape = next(s for s in SHAPES if s != row["shape"])
    other_motion = next(m for m in MOVES if m != row["motion"])
    scores = edit_match().score(None, [row["target"]] * 4, image=[row["image"]] * 4,
                                colour=[row["colour"], other_colour, row["colour"], row["colour"]],
                                shape=[row["shape"], row["shape"], other_shape, row["shape"]],
                                motion=[row["motion"], row["motion"], row["motion"], other_motion])
    assert scores == [1.0, 0.0, 0.0, 0.0]


def test_the_figure_draws_source_target_before_and_after(tmp_path):
    from mmrl.tasks.demos.synthetic.shape_edits import draw_samples
    rows = shape_edits(n_train=1, n_eval=2, size=16, seed=0)["eval"]
    draw_samples(rows, [r["image"] for r in rows], [r["target"] for r in rows], tmp_path / "samples.png")
    assert Image.open(tmp_path / "samples.png").size[0] > 0
