"""Video rewards on synthetic frame tensors: image rewards per frame, temporal consistency and
motion (optical flow), each against a reference computed by hand or by other means."""

import json
import math

import numpy as np
import pytest
import torch
from mmrl.core.scoring import compute_rewards, get_reward
from mmrl.rewards.clip import clip_score, image_embeddings, load_clip
from mmrl.rewards.colour_shape import PALETTE, colour_shape_score
from mmrl.rewards.video_frames import frame_indices, pil_frames
from mmrl.rewards.video_motion import flow_field, mean_flow, phase_shift
from PIL import Image, ImageDraw

TINY_CLIP = {"embed_dim": 16,
             "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
             "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "mmrl-tiny-clip-video.json"
    path.write_text(json.dumps(TINY_CLIP))
    return {"model_config": str(path), "pretrained": None, "device": "cpu"}


def disc_clip(colour: str, positions, size: int = 32, radius: int = 6) -> torch.Tensor:
    """[T, 3, H, W] float in [0, 1]: a `colour` disc at each (x, y) of `positions` on the palette background."""
    frames = []
    for x, y in positions:
        image = Image.new("RGB", (size, size), PALETTE["background"])
        ImageDraw.Draw(image).ellipse([x - radius, y - radius, x + radius, y + radius], fill=PALETTE[colour])
        frames.append(torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1))
    return torch.stack(frames)


def test_frame_choices():
    assert frame_indices(7, "all") == list(range(7))
    assert (frame_indices(7, "first"), frame_indices(7, "middle"), frame_indices(8, "middle")) == ([0], [3], [3])
    assert frame_indices(7, "last") == [6] and frame_indices(7, "every_3") == [0, 3, 6]
    for bad in ("every_0", "second", "every_x"):
        with pytest.raises(ValueError, match=f"frames={bad!r} is not one of all, first, middle, last or every_K"):
            frame_indices(7, bad)


def test_a_tensor_and_its_pil_frames_are_the_same_video():
    video = disc_clip("red", [(10, 10), (14, 12)])
    frames = pil_frames(video)
    assert len(frames) == 2 and frames[0].size == (32, 32)
    assert np.array_equal(np.asarray(frames[1]), (video[1].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
    uint8 = (video * 255).round().to(torch.uint8)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(pil_frames(uint8), frames))


def test_colour_shape_scores_a_video_frame_by_frame_with_the_named_aggregation():
    # the disc leaves the canvas: its later frames score lower
    video = disc_clip("red", [(16, 16), (26, 16), (29, 16), (34, 16)])
    by_frame = [colour_shape_score(f, "red", "circle") for f in pil_frames(video)]
    fn = get_reward("colour_shape")
    for frames, aggregate, want in (("all", "mean", sum(by_frame) / 4), ("all", "min", min(by_frame)),
                                    ("first", "mean", by_frame[0]), ("middle", "max", by_frame[1]),
                                    ("every_2", "mean", (by_frame[0] + by_frame[2]) / 2)):
        got = fn(["a red circle"] * 2, [video, list(pil_frames(video))], colour=["red", "red"],
                 shape=["circle", "circle"], frames=frames, aggregate=aggregate)
        assert got == pytest.approx([want, want]), (frames, aggregate)
    assert len(set(by_frame)) == 4
    # an image is a video of one frame: scored as before
    image = pil_frames(video)[0]
    assert fn(["x"], [image], colour=["red"], shape=["square"]) == [colour_shape_score(image, "red", "square")]


def test_per_frame_rewards_keep_the_recipe_checks_and_name_a_bad_aggregation():
    import inspect
    params = inspect.signature(get_reward("clip")).parameters
    assert params["frames"].default == "all" and params["aggregate"].default == "mean" and "model" in params
    video = disc_clip("red", [(16, 16), (18, 16)])
    with pytest.raises(Exception, match="aggregate='average' is not one of mean, min, max, median"):
        compute_rewards({"colour_shape": lambda **kw: get_reward("colour_shape")(aggregate="average", **kw)},
                        ["p"], [video], {"colour": ["red"], "shape": ["circle"]})


def test_clip_on_a_video_is_the_mean_of_its_frames_scores(tiny_clip):
    videos = [disc_clip("red", [(10, 10), (20, 20), (16, 8)]), disc_clip("blue", [(12, 20), (20, 12)])]
    scores = get_reward("clip")(["a red disc", "a blue disc"], videos, **tiny_clip)
    for video, prompt, score in zip(videos, ["a red disc", "a blue disc"], scores):
        frames = pil_frames(video)
        each = clip_score([prompt] * len(frames), frames, **tiny_clip)
        assert score == pytest.approx(sum(each) / len(each), abs=1e-6)


def test_temporal_consistency_against_hand_cosines(tiny_clip):
    fn = get_reward("temporal_consistency")
    still = disc_clip("green", [(16, 16)] * 3)
    moving = disc_clip("green", [(8, 16), (16, 16), (26, 10)])
    got = fn(["x", "x"], [still, moving], embedding="pixels")
    flat = moving.flatten(1).double()
    cos = [float(flat[i] @ flat[i + 1] / (flat[i].norm() * flat[i + 1].norm())) for i in range(2)]
    assert got == pytest.approx([1.0, sum(cos) / 2], abs=1e-5)
    assert fn(["x"], [moving], embedding="pixels", aggregate="min") == pytest.approx([min(cos)], abs=1e-5)
    net, preprocess, _ = load_clip(None, None, tiny_clip["model_config"], "cpu")
    emb = image_embeddings(net, preprocess, pil_frames(moving), 8, "cpu").double()
    want = float(((emb[0] @ emb[1]) + (emb[1] @ emb[2])) / 2)
    assert fn(["x"], [moving], **tiny_clip) == pytest.approx([want], abs=1e-5)


def test_image_consistency_compares_frames_with_the_conditioning_image(tiny_clip, tmp_path):
    video = disc_clip("red", [(10, 16), (16, 16), (22, 16)])
    frames = pil_frames(video)
    start = frames[0].resize((64, 64))  # the conditioning image at another size
    start.save(tmp_path / "start.png")
    fn = get_reward("image_consistency")
    flat = torch.stack([torch.from_numpy(np.asarray(f.resize((32, 32)), dtype=np.float64)).flatten() / 255
                        for f in [start, *frames]])
    flat = flat / flat.norm(dim=1, keepdim=True)
    cos = (flat[1:] @ flat[0]).tolist()
    got = fn(["x", "x"], [video, video], image=[start, str(tmp_path / "start.png")], embedding="pixels")
    assert got == pytest.approx([sum(cos) / 3] * 2, abs=1e-5) and cos[0] > cos[2]
    assert fn(["x"], [video], image=[start], embedding="pixels", frames="last") == pytest.approx([cos[2]], abs=1e-5)
    net, preprocess, _ = load_clip(None, None, tiny_clip["model_config"], "cpu")
    emb = image_embeddings(net, preprocess, [start.resize((32, 32)), frames[1]], 8, "cpu")
    assert fn(["x"], [video], image=[start], frames="middle", **tiny_clip) == \
        pytest.approx([float(emb[0] @ emb[1])], abs=1e-5)
    with pytest.raises(FileNotFoundError, match="conditioning image 'nowhere.png' does not exist"):
        fn(["x"], [video], image=["nowhere.png"], embedding="pixels")
    with pytest.raises(TypeError, match="required positional argument: 'image'"):  # refused before load (test_recipe_checks)
        fn(["x"], [video], embedding="pixels")


def shifted(image: torch.Tensor, dx: int, dy: int) -> torch.Tensor:
    return torch.roll(image, shifts=(dy, dx), dims=(-2, -1))


def test_phase_correlation_finds_known_integer_and_subpixel_shifts():
    gen = torch.Generator().manual_seed(0)
    texture = torch.rand(48, 64, generator=gen)
    for dx, dy in ((3, -2), (-7, 5), (0, 0), (11, 9)):
        assert phase_shift(texture, shifted(texture, dx, dy)).tolist() == pytest.approx([dx, dy], abs=1e-4)
    # sub-pixel shifts of the texture, made exactly in the Fourier domain (a band-limited shift)
    fy, fx = torch.fft.fftfreq(48)[:, None], torch.fft.fftfreq(64)[None]
    for dx, dy in ((1.5, 0.0), (-2.25, 0.75), (0.3, -4.6)):
        moved = torch.fft.ifft2(torch.fft.fft2(texture) * torch.exp(-2j * math.pi * (fx * dx + fy * dy))).real
        assert phase_shift(texture, moved).tolist() == pytest.approx([dx, dy], abs=0.05), (dx, dy)


def test_tiled_flow_sees_two_objects_move_apart_and_ignores_flat_tiles():
    gen = torch.Generator().manual_seed(1)
    a = torch.full((1, 1, 32, 64), 0.5)
    a[..., 8:24, 4:20] = torch.rand(16, 16, generator=gen)     # a patch in the left half
    a[..., 8:24, 36:52] = torch.rand(16, 16, generator=gen)    # one in the right half
    b = torch.full_like(a, 0.5)
    b[..., 8:24, 2:18] = a[..., 8:24, 4:20]                    # left patch moves 2 px left
    b[..., 10:26, 39:55] = a[..., 8:24, 36:52]                 # right patch 3 right, 2 down
    flow, weights = flow_field(torch.cat([a, b]), block=32)
    assert flow.shape == (1, 1, 2, 2)
    assert flow[0, 0, 0].tolist() == pytest.approx([-2, 0], abs=0.05)
    assert flow[0, 0, 1].tolist() == pytest.approx([3, 2], abs=0.05)
    assert (weights > 0).all()
    still = torch.full((3, 1, 32, 32), 0.25)
    assert flow_field(still, block=16)[1].eq(0).all() and mean_flow(still).abs().max() == 0


def test_motion_rewards_on_a_disc_moving_at_a_known_speed():
    right = disc_clip("red", [(8 + 3 * t, 16) for t in range(5)])          # 3 px/frame to the right
    up_left = disc_clip("blue", [(24 - 2 * t, 24 - 2 * t) for t in range(5)])  # 2 px left and 2 up per frame
    still = disc_clip("red", [(16, 16)] * 5)
    speed = get_reward("motion")(["x"] * 3, [right, up_left, still])
    assert speed == pytest.approx([3.0, 2 * math.sqrt(2), 0.0], abs=0.05)
    assert get_reward("motion")(["x"], [right], per_second=True, fps=[8]) == pytest.approx([24.0], abs=0.4)
    direction = get_reward("motion_direction")
    got = direction(["x"] * 5, [right, right, up_left, up_left, still],
                    direction=["right", "left", 135, "up", "down"])
    assert got == pytest.approx([1.0, -1.0, 1.0, math.cos(math.radians(45)), 0.0], abs=0.01)
    # below min_speed the score shrinks with the speed: 3 px/frame against min_speed 6
    assert direction(["x"], [right], direction=["right"], min_speed=6.0) == pytest.approx([0.5], abs=0.01)
    with pytest.raises(ValueError, match="direction 'sideways' is not one of right, up, left, down"):
        direction(["x"], [right], direction=["sideways"])
