"""vLLM rollouts for the vlm adapter (Qwen2.5-VL, images and videos) against the training forward.
Needs vLLM: run in the venv of scripts/make_vllm_env.sh as ``DIR/bin/python -m pytest -q -m vllm``;
skipped where vLLM is not importable. The video tests need torchvision (transformers' video
processors) and are skipped without it; without torchvision the image tests run through the shims of
tests/vllm_without_torchvision.py (none are applied where torchvision is installed).

Tolerance: 1e-3 on |vLLM's processed log-prob - the training forward's| (fp32, max over every
real token), as tests/test_vllm.py; measured ~4e-6 with images and with videos. A vision tower
that was not synced, an image or video that vLLM saw differently, or other time positions of a
video's frames, move the completion's log-probs by far more (checked below)."""

import copy
import importlib.util

import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

import vllm_without_torchvision  # noqa: E402
from mmrl.tasks.demos.synthetic.moving_dot import moving_dot  # noqa: E402
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy  # noqa: E402

from mmrl.config.parse import parse_config  # noqa: E402
from mmrl.train.loop.trainer import Trainer  # noqa: E402
from mmrl.train.reporting.tracking import read_metrics  # noqa: E402

vllm_without_torchvision.apply()

TOL = 1e-3
# vLLM's CPU attention takes head_dim 64: a text model of hidden 256 over 4 heads; the vision
# tower (its own attention, any head dim) keeps the tiny default
TINY = {"hidden": 256, "layers": 2, "heads": 4}
needs_torchvision = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                                       reason="videos need torchvision (transformers' video processors)")
# the video demo's frame sampling and size bounds (tasks/recipes/video_qa.yaml), fewer frames
VIDEO = {"num_frames": 4, "video_min_pixels": 784, "video_max_pixels": 3136}


def images(n, size=56, seed=0):
    from PIL import Image
    gen = torch.Generator().manual_seed(seed)
    return [Image.fromarray((torch.rand(size, size, 3, generator=gen) * 255).to(torch.uint8).numpy()) for _ in range(n)]


def rows():
    pics = images(5)
    return [{"prompt": "what colour is the shape?", "image": pics[0]},
            {"prompt": "count the dots", "image": pics[1]},
            {"prompt": "compare <image> and <image>", "image": [pics[2], pics[3]]},  # two images, placed in the text
            {"prompt": "describe it", "image": pics[4]}]


def perturb(model, seed):
    """Move every weight in place (as an optimizer step does) by seeded noise."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen).to(p.dtype))


def gaps(policy, rollout, model=None):
    """|vLLM's log-prob - the forward's| over the real tokens (the forward of `model`, default the policy's)."""
    with torch.no_grad():
        logp, _ = policy.logprobs(model if model is not None else policy.model, rollout)
    real = rollout.unit_mask.bool()
    assert rollout.rollout_logp is not None and real.sum() > 0
    return (rollout.rollout_logp - logp)[real].abs()


def with_extras(rollout, **changes):
    """A copy of `rollout` whose extras have `changes` (key: a function of the old value)."""
    other = copy.copy(rollout)
    other.extras = {**rollout.extras, **{k: change(rollout.extras[k]) for k, change in changes.items()}}
    return other


def first_groups_swapped(rows: list, size: int) -> list:
    """Per-row values with the rows of groups 0 and 1 (`size` rows each) exchanged."""
    return rows[size:2 * size] + rows[:size] + rows[2 * size:]


@pytest.fixture(scope="module")
def policy():
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", tiny_args=TINY, temperature=0.7, max_new_tokens=10,
                                 rollout_engine="vllm"))
    vllm_without_torchvision.use_processor(policy.processor)
    return policy


def test_vlm_logprobs_match_the_training_forward_after_a_weight_sync(policy):
    data = rows()
    policy.rollout(data[:1], 2, [0])  # the engine is built, and sees the initial weights and an image
    perturb(policy.model, 1)  # language model and vision tower alike
    rollout = policy.rollout(data, 4, [1, 2, 3, 4])
    gap = gaps(policy, rollout)
    assert len(gap) >= 40
    assert float(gap.max()) <= TOL, f"max |vllm - forward| = {float(gap.max())} over {len(gap)} tokens"
    assert rollout.extras["image_grid_thw"][8].shape[0] == 2  # the two-image prompt kept both
    # the new weights were used, vision tower included: a model whose vision tower alone keeps
    # other weights scores the same completions differently
    other = copy.deepcopy(policy.model)
    perturb(other.model.visual, 2)
    assert float(gaps(policy, rollout, other).max()) > 100 * TOL
    # and vLLM saw each row's own image: the completions scored with the images swapped disagree
    swapped = with_extras(rollout, pixel_values=lambda v: first_groups_swapped(v, 4),  # 1 image each
                          image_grid_thw=lambda v: first_groups_swapped(v, 4))
    assert float(gaps(policy, swapped)[:16].max()) > 100 * TOL


def test_vlm_media_tokens_are_never_sampled_and_a_group_depends_on_its_prompt_and_seed(policy):
    data = rows()
    whole = policy.rollout(data, 4, [10, 11, 12, 13])
    alone = policy.rollout(data[1:2], 4, [11])
    assert whole.completions[4:8] == alone.completions
    banned = set(policy.suppressed_tokens())
    sampled = {t for ids in whole.columns["completion_ids"] for t in ids}
    assert banned and not banned & sampled


def train_two_steps(tmp_path, policy: dict, data: dict) -> list[dict]:
    """Two GRPO steps with vLLM rollouts of the tiny Qwen2.5-VL, rewarded by the share of digits (a
    random model's samples already differ in it); the weights must change. Each step's metrics."""
    recipe = {"task": "vlm", "policy": {"model": "tiny:qwen2.5-vl-char", "tiny_args": TINY, "rollout_engine": "vllm",
                                        **policy},
              "data": data, "rewards": {"digit_share": {"weight": 1.0}},
              "reward_modules": [str(__import__("pathlib").Path(__file__).parent / "digit_reward.py")],
              "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2, "micro_batch_size": 6},
              "logging": {"report_to": ["none"], "progress": False}, "max_steps": 2, "seed": 0}
    cfg = parse_config(recipe, [f"output_dir={tmp_path / 'run'}"])
    trainer = Trainer(cfg)
    vllm_without_torchvision.use_processor(trainer.policy.processor)
    start = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    trainer.train()
    assert any(not torch.equal(p, start[n]) for n, p in trainer.unwrapped.named_parameters())
    assert trainer.policy._vllm is not None
    return [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward_mean" in r]


def test_two_steps_train_with_vllm_image_rollouts(tmp_path):
    records = train_two_steps(tmp_path, {"max_new_tokens": 6},
                              {"name": "shapes", "args": {"n_train": 16, "n_eval": 4, "size": 56}})
    assert len(records) == 2
    # each step sampled with that step's weights (the second after the first's optimizer step)
    assert all(r["rollout/logp_diff_max"] <= TOL for r in records), [r["rollout/logp_diff_max"] for r in records]


def video_rows():
    """Moving-dot clips (8 frames of 56 x 56 at 4 fps, 4 sampled), and one row with an image and a
    clip of another frame rate (8 fps: other time positions)."""
    rows = moving_dot(n_train=3, n_eval=0, frames=8, size=56, seed=0)["train"]
    clip = moving_dot(n_train=1, n_eval=0, frames=6, size=56, seed=1)["train"][0]["video"]
    return rows + [{"prompt": "which way, and what colour is <image>?", "image": images(1)[0],
                    "video": {"frames": clip["frames"], "fps": 8.0}}]


@pytest.fixture(scope="module")
def video_policy():
    """A policy with T-GRPO's shuffled rollouts (2 per group), so every rollout also has rows whose
    frames vLLM sees in another order."""
    return VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", tiny_args=TINY, temperature=0.7, max_new_tokens=10,
                               rollout_engine="vllm", shuffled_rollouts=2, **VIDEO))


@needs_torchvision
def test_vlm_video_logprobs_match_the_training_forward_after_a_weight_sync(video_policy):
    policy, data = video_policy, video_rows()
    policy.rollout(data[:1], 2, [0])  # the engine is built and sees the initial weights and a clip
    perturb(policy.model, 3)
    rollout = policy.rollout(data, 4, [1, 2, 3, 4])
    gap = gaps(policy, rollout)
    assert len(rollout) == 4 * (4 + 2) and int(rollout.auxiliary.sum()) == 4 * 2
    assert len(gap) >= 100
    assert float(gap.max()) <= TOL, f"max |vllm - forward| = {float(gap.max())} over {len(gap)} tokens"
    grids, seconds = rollout.extras["video_grid_thw"], rollout.extras["second_per_grid_ts"]
    assert [g.tolist() for g in grids[:1]] == [[[2, 4, 4]]]  # 4 frames in 2 temporal patches, resized to 56 x 56
    assert float(seconds[0]) == 1.0 and float(seconds[-1]) == 0.375  # 4 frames, 2 per patch: 2 s / 2, 0.75 s / 2
    assert len(rollout.extras["image_grid_thw"][-1]) == 1  # the last row has its image beside its clip
    # vLLM placed the frames in time as the policy did: the same completions scored with other
    # seconds per temporal patch (Qwen2.5-VL's time positions) disagree
    shifted = with_extras(rollout, second_per_grid_ts=lambda v: [2 * s for s in v])
    assert float(gaps(policy, shifted).max()) > 100 * TOL
    # and saw each row's own clip: the completions scored with the clips of groups 0 and 1 swapped disagree
    swapped = with_extras(rollout, pixel_values_videos=lambda v: first_groups_swapped(v, 6))  # 4 + 2 shuffled rows
    assert float(gaps(policy, swapped)[:24].max()) > 100 * TOL


@pytest.fixture(scope="module")
def qwen3_policy():
    """Module-scoped as the others: vLLM's process-wide parallel state goes with the first engine
    destroyed, and the engines still alive then fail."""
    return VLMPolicy(VLMConfig(model="tiny:qwen3-vl-char", tiny_args=TINY, temperature=0.7, max_new_tokens=10,
                               rollout_engine="vllm", shuffled_rollouts=2, **VIDEO))


@needs_torchvision
def test_qwen3_vl_video_and_image_logprobs_match_the_training_forward(qwen3_policy):
    """Qwen3-VL marks each frame with its time stamp in the text (its processor's, from the clip's
    metadata) instead of time-scaled positions: vLLM's rollouts match the forward there too."""
    policy, data = qwen3_policy, video_rows()
    policy.rollout(data[:1], 2, [0])
    perturb(policy.model, 4)
    rollout = policy.rollout(data, 4, [1, 2, 3, 4])
    gap = gaps(policy, rollout)
    assert len(gap) >= 100 and float(gap.max()) <= TOL, float(gap.max())
    swapped = with_extras(rollout, pixel_values_videos=lambda v: first_groups_swapped(v, 6))  # vLLM saw its own
    assert float(gaps(policy, swapped)[:24].max()) > 100 * TOL


@needs_torchvision
def test_vlm_video_group_depends_on_its_prompt_and_seed_and_shuffled_rows_see_other_frames(video_policy):
    data = video_rows()
    whole = video_policy.rollout(data, 4, [20, 21, 22, 23])
    alone = video_policy.rollout(data[2:3], 4, [22])
    assert whole.completions[12:18] == alone.completions  # group 2: its 4 ordered and 2 shuffled rows
    assert torch.equal(whole.rollout_logp[12:18, :alone.rollout_logp.shape[1]], alone.rollout_logp)
    pixels = whole.extras["pixel_values_videos"]
    assert torch.equal(pixels[0], pixels[3]) and not torch.equal(pixels[0], pixels[4])  # ordered vs shuffled


@needs_torchvision
def test_two_steps_train_with_vllm_video_rollouts(tmp_path):
    """The video demo's clips with vLLM rollouts, T-GRPO's shuffled ones among them."""
    records = train_two_steps(tmp_path, {"max_new_tokens": 8, "shuffled_rollouts": 2, **VIDEO},
                              {"name": "moving_dot", "args": {"n_train": 16, "n_eval": 4, "frames": 8, "size": 56}})
    assert len(records) == 2
    assert all(r["rollout/logp_diff_max"] <= TOL for r in records), [r["rollout/logp_diff_max"] for r in records]
