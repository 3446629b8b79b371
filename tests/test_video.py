"""Video in the vision-language adapter on a tiny random Qwen2.5-VL: clips of different lengths and
sizes (files written with PyAV, frame lists), frame sampling by count and by rate, batch-size
invariance with T-GRPO's shuffled rollouts, exact on-policy log-probs, streaming, a training step,
the T-GRPO bonus per group, broken video files named."""

import sys
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from helpers import assert_grads_close, on_policy_step_changes, streamed_grads
from mmrl.rewards.t_grpo import t_grpo_reward
from mmrl.tasks.lm.video_clips import load_video, sample_indices
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy

from mmrl.config.parse import parse_config
from mmrl.core.scoring import metric_logger
from mmrl.train.loop.trainer import Trainer

RNG = np.random.default_rng(0)
SMALL_FRAMES = {"video_min_pixels": 28 * 28, "video_max_pixels": 56 * 56}


def write_clip(path: Path, frames: int, rate: int, size: int = 32) -> Path:
    """A clip whose frame k is a flat grey of level 10 k (so a decoded frame tells its index)."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for k in range(frames):
            image = av.VideoFrame.from_ndarray(np.full((size, size, 3), 10 * k, dtype=np.uint8), format="rgb24")
            for packet in stream.encode(image):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def frame_levels(clip) -> list[int]:
    return (clip.frames.reshape(len(clip.frames), -1).mean(1) / 10).round().astype(int).tolist()


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])  # mkv reports no frame count: counted by decoding
def test_sampling_by_count_and_by_rate(tmp_path, suffix):
    path = write_clip(tmp_path / f"ramp{suffix}", frames=20, rate=10)
    clip = load_video(path, num_frames=5)
    assert clip.indices == [0, 5, 10, 14, 19] and frame_levels(clip) == clip.indices
    assert (clip.total_frames, clip.fps) == (20, 10.0)
    clip = load_video(path, fps=2.5)  # one frame every 0.4 s of a 2 s clip
    assert clip.indices == [0, 4, 8, 12, 16] and frame_levels(clip) == clip.indices
    assert load_video(path, fps=2.5, max_frames=3).indices == [0, 8, 16]
    assert len(load_video(path, num_frames=50).indices) == 20  # never more frames than the video has


def test_sample_indices_reference():
    assert sample_indices(10, 30.0, num_frames=4) == [0, 3, 6, 9]
    assert sample_indices(9, 3.0, fps=2.0) == [0, 1, 3, 4, 6, 7]  # t = 0, 0.5, ..., 2.5 s at 3 fps
    assert sample_indices(1, 30.0, num_frames=8) == [0]
    with pytest.raises(ValueError, match="not both"):
        sample_indices(10, 30.0, num_frames=4, fps=1.0)


def test_second_per_grid_follows_the_sampling_rate(tmp_path):
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", fps=2.5, **SMALL_FRAMES))
    enc = policy._encode_prompts([{"prompt": "q", "video": str(write_clip(tmp_path / "c.mp4", 20, 10))}])
    # 5 frames kept of 20 at 10 fps: 2.5 frames per second, 2 frames per temporal patch
    assert torch.allclose(enc["second_per_grid_ts"][0], torch.tensor([2 / 2.5]))
    assert enc["video_grid_thw"][0].tolist() == [[3, 2, 2]]


def test_one_video_or_a_list_of_videos(tmp_path):
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", num_frames=3, **SMALL_FRAMES))
    path = str(write_clip(tmp_path / "c.mp4", 10, 5))
    frames = [np.zeros((8, 8, 3), np.uint8)] * 4
    assert [len(c.frames) for c in policy._clips({"video": frames})] == [3]  # a list of frames is one video
    assert [len(c.frames) for c in policy._clips({"video": np.stack(frames)})] == [3]
    assert [len(c.frames) for c in policy._clips({"video": [path, {"frames": frames[:2]}]})] == [3, 2]
    content, media = policy._media({"video": [path, path]})
    assert content == [{"type": "video"}] * 2 and len(media["videos"]) == 2


def test_times_stay_fp32_in_a_bf16_model():
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", dtype="bfloat16", fps=2.5, **SMALL_FRAMES))
    rows = policy._expand(policy._encode_prompts([{"prompt": "q", "video": np.zeros((5, 28, 28, 3), np.uint8)}]), 1)
    inputs = policy._model_inputs(rows)
    assert inputs["pixel_values_videos"].dtype == torch.bfloat16
    assert inputs["second_per_grid_ts"].dtype == torch.float32


def test_broken_video_file_is_named(tmp_path):
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"not a video" * 20)
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", max_new_tokens=2, **SMALL_FRAMES))
    with pytest.raises(ValueError, match="broken.mp4"):
        policy.rollout([{"prompt": "x", "video": str(bad)}], 1, seeds=[0])
    with pytest.raises(ValueError, match="missing.mp4"):
        policy.rollout([{"prompt": "x", "video": str(tmp_path / "missing.mp4")}], 1, seeds=[0])
    with pytest.raises(ValueError, match="policy.num_frames=0"):
        VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", num_frames=0))
    with pytest.raises(ValueError, match="frame 1"):
        load_video([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8), np.float32)])


@pytest.fixture(scope="module")
def policy():
    return VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", max_new_tokens=6, shuffled_rollouts=2, **SMALL_FRAMES))


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """Videos of 3 to 12 frames and two frame sizes, from a file and from frame lists; a row with
    an image and no video (no shuffled rollouts) beside them."""
    path = write_clip(tmp_path_factory.mktemp("video") / "clip.mp4", frames=12, rate=6, size=56)
    from PIL import Image
    return [{"prompt": "which way?", "video": str(path)},
            {"prompt": "short", "video": list(RNG.integers(0, 255, (3, 28, 56, 3), dtype=np.uint8))},
            {"prompt": "an image", "image": Image.fromarray(RNG.integers(0, 255, (56, 56, 3), dtype=np.uint8))},
            {"prompt": "frames", "video": {"frames": RNG.integers(0, 255, (6, 56, 28, 3), dtype=np.uint8), "fps": 3}}]


def test_shuffled_rollouts_are_auxiliary_rows_of_their_group(policy, rows):
    batch = policy.rollout(rows, 3, seeds=[1, 2, 3, 4])
    assert batch.group_id.tolist() == [0] * 5 + [1] * 5 + [2] * 3 + [3] * 5
    assert batch.auxiliary.tolist() == ([False] * 3 + [True] * 2) * 2 + [False] * 3 + [False] * 3 + [True] * 2
    again = policy.rollout(rows, 3, seeds=[1, 2, 3, 4])
    assert again.completions == batch.completions  # the shuffle and the samples come from the seeds
    ordered, shuffled = batch.extras["pixel_values_videos"][0], batch.extras["pixel_values_videos"][3]
    assert ordered.shape == shuffled.shape and not torch.equal(ordered, shuffled)
    for key in ("video_grid_thw", "second_per_grid_ts"):  # same clip, same time positions
        assert torch.equal(batch.extras[key][0], batch.extras[key][3])
    # the frames reach the log-probs: row 0's completion scored with the shuffled frames differs
    pair = batch.select([0, 3])
    pair.extras["completion_ids"] = pair.extras["completion_ids"][[0, 0]]
    pair.unit_mask = pair.unit_mask[[0, 0]]
    with torch.no_grad():
        logp, _ = policy.logprobs(policy.model, pair)
    assert not torch.allclose(logp[0], logp[1])


def test_each_row_equals_the_row_alone(policy, rows):
    batch = policy.rollout(rows, 3, seeds=[1, 2, 3, 4])
    full, _ = policy.logprobs(policy.model, batch)
    for g, row in enumerate(rows):
        alone = policy.rollout([row], 3, seeds=[g + 1])
        mine = (batch.group_id == g).nonzero().flatten()
        assert alone.completions == [batch.completions[i] for i in mine]
        assert torch.equal(alone.auxiliary, batch.auxiliary[mine])
        single, _ = policy.logprobs(policy.model, alone)
        assert torch.allclose(full[mine, :single.shape[1]], single, atol=1e-5)
    with torch.no_grad():  # on-policy: the same rows scored again give exactly the same log-probs
        old, _ = policy.logprobs(policy.model, batch)
    assert torch.equal(old, full)


def test_sampler_and_training_log_probs_agree_on_every_row_with_the_prompt_shared(rows):
    """The log-probs HF generate sampled with and the training forward's, computed in other batch
    compositions, on ordered and shuffled rows alike, with each group's prompt run once
    (prefix_sharing on). A group's shuffled rows share the group's prompt ids, not its frames, so
    they form a prompt group of their own."""
    shared = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", max_new_tokens=6, shuffled_rollouts=2,
                                 prefix_sharing="on", temperature=0.8, **SMALL_FRAMES))
    batch = shared.rollout(rows, 3, seeds=[5, 6, 7, 8])
    with torch.no_grad():
        logp, _ = shared.logprobs(shared.model, batch)
    real = batch.unit_mask.bool()
    assert batch.auxiliary.any() and real[batch.auxiliary].sum() > 0
    gap = (batch.rollout_logp - logp)[real].abs()
    assert float(gap.max()) <= 1e-4, float(gap.max())


def accuracy_rows(groups):
    """(completions, group_id, auxiliary, answers) from [(group, auxiliary, correct), ...]."""
    return ([f"<answer>{'A' if ok else 'B'}</answer>" for _, _, ok in groups], [g for g, _, _ in groups],
            [aux for _, aux, _ in groups], ["A"] * len(groups))


def test_t_grpo_bonus_per_group_not_per_batch():
    counts = {}
    # group 7: ordered 3/4 correct, shuffled 1/2 -> 0.75 >= 0.8 x 0.5: its correct rows get the bonus
    # group 2: ordered 1/4 correct, shuffled 2/2 -> 0.25 < 0.8: no bonus
    # over the whole batch (Video-R1's code): ordered 4/8 < 0.8 x shuffled 3/4, nobody would get it
    # group 5 has no shuffled rows (an image prompt): not applicable; rows of two groups interleave
    spec = [(7, False, True), (2, False, False), (7, False, True), (7, True, True), (2, True, True),
            (7, False, False), (2, False, True), (7, False, True), (2, False, False), (7, True, False),
            (2, False, False), (2, True, True), (5, False, True)]
    completions, group_id, auxiliary, answers = accuracy_rows(spec)
    out = t_grpo_reward([""] * len(spec), completions, group_id, auxiliary, answer=answers,
                        accuracy_args={"mode": "choice"}, log_metric=metric_logger(counts))
    expected = {(7, False, True): 0.3, (7, False, False): 0.0, (2, False, True): 0.0, (2, False, False): 0.0}
    assert out == [None if aux or g == 5 else expected[(g, aux, ok)] for g, aux, ok in spec]
    assert counts == {"groups": 2.0, "bonus_groups": 1.0}
    counts = {}
    # a stricter min_ratio: 0.75 < 2 x 0.5, no group gets it
    out = t_grpo_reward([""] * len(spec), completions, group_id, auxiliary, answer=answers, min_ratio=2.0, alpha=0.5,
                        accuracy_args={"mode": "choice"}, log_metric=metric_logger(counts))
    assert all(v in (None, 0.0) for v in out)
    assert counts == {"groups": 2.0, "bonus_groups": 0.0}


VIDEO_RECIPE = {
    "task": "vlm",
    "policy": {"model": "tiny:qwen2.5-vl-char", "max_new_tokens": 6, "num_frames": 4, "shuffled_rollouts": 2,
               **SMALL_FRAMES},
    "data": {"name": "moving_dot", "args": {"n_train": 16, "n_eval": 4, "frames": 6, "size": 56}},
    "rewards": {"digit_share": {"weight": 1.0},
                "t_grpo": {"weight": 1.0, "args": {"accuracy_args": {"mode": "choice"}}}},
    "reward_modules": [str(Path(__file__).parent / "digit_reward.py")],
    "algorithm": {"group_size": 3},
    "optim": {"lr": 1e-2, "prompts_per_step": 3, "micro_batch_size": 9},
    "logging": {"report_to": ["none"], "progress": False},
    "max_steps": 1,
}


def test_streaming_and_a_training_step(tmp_path):
    t = Trainer(parse_config(VIDEO_RECIPE, [f"output_dir={tmp_path}"]))
    batch = t.prepare_batch(1)
    assert len(batch.rollout) == 9 and batch.rollout.auxiliary is None  # the shuffled rows never train
    assert batch.metrics["reward/t_grpo/groups"] == 3.0 and "auxiliary/reward/digit_share" in batch.metrics
    assert_grads_close(*streamed_grads(t, batch, (9, 2)))
    changed = on_policy_step_changes(t)
    assert any("visual" in n for n in changed) and any("language_model" in n for n in changed)
    held_out = t.evaluate()  # scored on the ordered rows only
    assert {"reward/t_grpo", "reward_mean_se", "greedy/t_grpo"} <= set(held_out)
    assert held_out["reward/t_grpo/groups"] == held_out["greedy/t_grpo/groups"] == 4.0  # the 4 held-out prompts
    assert t.train_step()["reward/t_grpo/groups"] == 3.0  # evaluation's counts stay out of training's


@pytest.mark.slow
def test_t_grpo_one_and_two_processes_agree(tmp_path):
    """Groups are spread over two processes (gloo on CPU): the bonus, the shuffled rows' rewards,
    the loss and the weights equal one process's."""
    import yaml
    from safetensors.torch import load_file
    from test_distributed import free_port, run_cli
    recipe = tmp_path / "recipe.yaml"  # a graded "accuracy" (digit share) so the bonus varies between groups
    cfg = dict(VIDEO_RECIPE, rewards={"digit_share": {"weight": 1.0}, "t_grpo": {
        "weight": 1.0, "args": {"accuracy": "digit_share", "correct_above": 0.0, "min_ratio": 1.0}}},
        optim={**VIDEO_RECIPE["optim"], "prompts_per_step": 4, "micro_batch_size": 5})
    recipe.write_text(yaml.safe_dump(cfg))
    single = run_cli([sys.executable], recipe, tmp_path / "one", 2)
    double = run_cli([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                      "--master_addr", "127.0.0.1", "--master_port", str(free_port())], recipe, tmp_path / "two", 2)
    assert any(0 < r["reward/t_grpo/bonus_groups"] < r["reward/t_grpo/groups"] for r in single)
    for a, b in zip(single, double):
        for key in ("reward/t_grpo", "reward/t_grpo/groups", "reward/t_grpo/bonus_groups",
                    "auxiliary/reward/digit_share", "reward/digit_share", "loss", "advantage_std"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
    w1 = load_file(tmp_path / "one" / "checkpoints" / "step-000002" / "model" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "checkpoints" / "step-000002" / "model" / "model.safetensors")
    for name in w1:
        assert torch.allclose(w1[name], w2[name], atol=1e-6), name
