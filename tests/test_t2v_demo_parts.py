"""The t2v demo's parts: the synthetic clips move the stated way (the motion reward reads it), the
pixel video family's rollouts are clips of the configured frames, its warm start trains on clips,
and the held-out clip judge names colour, shape and direction of clean clips it has not seen."""

import random

import pytest
import torch
from mmrl.rewards.video_motion import mean_flow
from mmrl.rewards.video_frames import frame_tensor
from mmrl.tasks.demos.clip_judge import clip_match, train_judge
from mmrl.tasks.demos.synthetic.colour_shapes import BACKGROUND, COLOURS, SHAPES
from mmrl.tasks.demos.synthetic.moving_shapes import DIRECTIONS, SPEED, draw_clip, moving_shapes


@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_a_clip_moves_its_direction_by_its_speed(direction):
    rng = random.Random(5)
    for _ in range(10):
        clip = draw_clip("red", "square", direction, 16, 4, rng)
        flow = mean_flow(frame_tensor(clip))  # [T-1, (dx, dy)] by phase correlation
        expected = torch.tensor(DIRECTIONS[direction], dtype=torch.float32) * SPEED
        assert torch.allclose(flow, expected.expand_as(flow), atol=0.3), (direction, flow)


def _margins(frame):
    """(left, right, top, bottom): the background columns / rows on each side of the shape."""
    import numpy as np
    ink = (np.asarray(frame).astype(int) - np.array(BACKGROUND)).__abs__().sum(-1) > 0
    cols, rows = np.flatnonzero(ink.any(0)), np.flatnonzero(ink.any(1))
    return cols[0], ink.shape[1] - 1 - cols[-1], rows[0], ink.shape[0] - 1 - rows[-1]


@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_a_jitter_of_0_centres_the_path_and_none_does_not(direction):
    rng = random.Random(3)
    off_centre = []
    for jitter in (0, None):
        for _ in range(20):
            clip = draw_clip("blue", "square", direction, 16, 4, rng, jitter=jitter)
            first, last = _margins(clip[0]), _margins(clip[-1])
            # the path's margins: left of its leftmost frame vs right of its rightmost, top vs bottom
            left, right = min(first[0], last[0]), min(first[1], last[1])
            top, bottom = min(first[2], last[2]), min(first[3], last[3])
            worst = max(abs(left - right), abs(top - bottom))
            if jitter == 0:
                assert worst <= 1, (direction, first, last)
            else:
                off_centre.append(worst > 1)
    assert any(off_centre)


def test_the_data_names_each_row_and_cycles_the_held_out_triples():
    data = moving_shapes(n_train=8, n_eval=32, size=16, frames=4, seed=0)
    row = data["eval"][0]
    assert row["prompt"] == f"{row['colour']} {row['shape']} moving {row['direction']}"
    assert len(row["clip"]) == 4 and row["clip"][0].size == (16, 16)
    triples = {(r["colour"], r["shape"], r["direction"]) for r in data["eval"]}
    assert len(triples) == len(COLOURS) * len(SHAPES) * len(DIRECTIONS)


def _policy(frames=4):
    from mmrl.tasks.diffusion.config import DiffusionConfig
    from mmrl.tasks.diffusion.policy import DiffusionPolicy
    cfg = DiffusionConfig(model="tiny:pixel-flow-video", tiny_args={"channels": [16, 32], "frames": 4},
                          height=16, width=16, num_frames=frames, num_steps=3, eval_num_steps=2,
                          classifier_free_guidance=False, guidance_scale=1.0, sampler="dance", noise_level=0.3)
    return DiffusionPolicy(cfg)


def test_a_rollout_is_a_clip_of_the_configured_frames_with_its_fps():
    policy = _policy()
    rollout = policy.rollout(["red circle moving right"], group_size=2, seeds=[0])
    assert len(rollout.completions) == 2
    assert [len(c) for c in rollout.completions] == [4, 4]
    assert rollout.completions[0][0].size == (16, 16)
    assert rollout.extras["latents"].shape[2:] == (3, 4, 16, 16)
    assert rollout.columns["fps"] == [8, 8]


def test_frames_that_do_not_fit_the_unet_are_refused():
    with pytest.raises(ValueError, match="policy.num_frames=5"):
        _policy(frames=5)


def test_the_warm_start_loss_reads_clips_and_trains():
    policy = _policy()
    rows = moving_shapes(n_train=8, n_eval=1, size=16, frames=4, seed=0)["train"]
    torch.manual_seed(0)
    loss = policy.supervised_loss(policy.model, rows, "clip")
    loss.backward()
    grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
    assert loss.item() > 0 and grads and any(g.abs().sum() > 0 for g in grads)


@pytest.fixture(scope="module")
def judge():
    return train_judge(frames=4, size=16, seed=1)


@pytest.mark.slow  # 169 s in the default run on 2 cores beside two demos (2026-11-29); the default run stays under 15 min
def test_the_judge_names_colour_shape_and_direction_of_unseen_clean_clips(judge):
    rng = random.Random(4321)  # not the judge's training seed
    truth = [(c, s, d) for c in COLOURS for s in SHAPES for d in DIRECTIONS for _ in range(8)]
    clips = [draw_clip(c, s, d, 16, 4, rng) for c, s, d in truth]
    colours, shapes, directions = judge.predict(clips)
    for got, k in ((colours, 0), (shapes, 1), (directions, 2)):
        assert sum(g == t[k] for g, t in zip(got, truth)) / len(truth) >= 0.9, k


def test_a_still_shape_earns_no_direction(judge):
    rng = random.Random(77)
    still = [draw_clip(c, "circle", None, 16, 4, rng) for c in COLOURS for _ in range(10)]
    _, _, directions = judge.predict(still)
    assert sum(d == "still" for d in directions) / len(directions) >= 0.9


def test_the_evaluator_needs_all_three_right(monkeypatch, judge):
    import mmrl.tasks.demos.clip_judge as module
    monkeypatch.setattr(module, "clip_judge", lambda frames, size, seed: judge)
    clip = draw_clip("blue", "square", "up", 16, 4, random.Random(9))
    scores = clip_match().score(None, [clip] * 4, colour=["blue", "red", "blue", "blue"],
                                shape=["square", "square", "circle", "square"], direction=["up", "up", "up", "left"])
    assert scores == [1.0, 0.0, 0.0, 0.0]


def test_the_figure_draws_frames_in_rows_and_writes_gifs(tmp_path):
    from PIL import Image

    from mmrl.tasks.demos.synthetic.moving_shapes import draw_samples
    rows = moving_shapes(n_train=1, n_eval=2, size=16, frames=4, seed=0)["eval"]
    clips = [r["clip"] for r in rows]
    draw_samples(rows, clips, clips[::-1], tmp_path / "samples.png")
    sheet = Image.open(tmp_path / "samples.png")
    assert sheet.height == 2 * 3 * (16 * 4 + 4)  # target, before, after per row, frames 4x
    gif = Image.open(tmp_path / "samples_01_before.gif")
    assert gif.n_frames == 4 and gif.size == (64, 64)
