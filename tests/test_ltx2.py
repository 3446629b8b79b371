"""LTX-2 (`LTX2Pipeline`, text to video with sound) on its tiny random pipeline (`tiny:ltx2`): the
ODE path equals the stock call (video and audio latents, frames and waveform, with and without
CFG), the sampler's log-probs equal the training forward's and a step's log-density covers the
video and the audio latents both, the training methods take on-policy steps, a trained LoRA loads
in the stock pipeline (`load_lora_weights`) and draws what the policy drew, the recipe trains two
steps, the rewards read the sound, the picture or both; image to video (`LTX2ImageToVideoPipeline`)
equals its stock call and its log-probs the training forward's."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from helpers import FLOW_METHODS, on_policy_step_changes, shipped_recipe_trains_two_steps
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.demos.tiny_video_generators import tiny_ltx2

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.train.safety.checkpoint import latest_checkpoint

SIZE, FRAMES, STEPS, SEED, PROMPT, SCALE = 32, 5, 3, 7, "a dog barks", 3.0
RECIPE = {"task": "diffusion",
          "policy": {"model": "tiny:ltx2", "height": SIZE, "width": SIZE, "num_frames": FRAMES, "num_steps": STEPS,
                     "eval_num_steps": STEPS, "noise_level": 0.7, "guidance_scale": SCALE},
          "data": {"name": "words_to_say", "args": {"n_train": 8, "n_eval": 2}},
          "rewards": {"loudness": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "digit_reward.py")],
          "algorithm": {"group_size": 3, "eps_low": 1e-3, "eps_high": 1e-3},
          "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 6},
          "logging": {"report_to": ["none"], "progress": False}, "max_steps": 1}


def make(guided=True, **kw):
    args = dict(model="tiny:ltx2", height=SIZE, width=SIZE, num_frames=FRAMES, num_steps=STEPS, eval_num_steps=STEPS,
                sampler="flow_sde", noise_level=0.7, classifier_free_guidance=guided, guidance_scale=SCALE)
    return DiffusionPolicy(DiffusionConfig(**{**args, **kw}))


def stock_call(pipe, guided=True, output_type="latent"):
    """LTX2Pipeline's call with plain CFG on both streams (the policy's guidance: no rescale, no
    spatio-temporal or modality-isolation guidance), 24 frames a second."""
    scale = SCALE if guided else 1.0
    return pipe([PROMPT], height=SIZE, width=SIZE, num_frames=FRAMES, frame_rate=24.0, num_inference_steps=STEPS,
                guidance_scale=scale, audio_guidance_scale=scale, stg_scale=0.0, audio_stg_scale=0.0,
                modality_scale=1.0, audio_modality_scale=1.0, guidance_rescale=0.0, audio_guidance_rescale=0.0,
                generator=torch.Generator().manual_seed(SEED), output_type=output_type)


def ode_sample(policy):
    """The policy's sample at noise 0: (final flat latents [D], the completion)."""
    policy.cfg.noise_level = 0.0
    rollout = policy.rollout([PROMPT], 1, seeds=[SEED])
    return rollout.extras["latents"][0, -1], rollout.completions[0]


def packed(pipe, out):
    """The stock call's latents output packed and normalised as the policy's flat latents [D]."""
    vae, audio_vae = pipe.vae, pipe.audio_vae
    video = pipe._pack_latents(pipe._normalize_latents(out.frames, vae.latents_mean, vae.latents_std,
                                                       vae.config.scaling_factor))
    audio = pipe._normalize_audio_latents(pipe._pack_audio_latents(out.audio), audio_vae.latents_mean,
                                          audio_vae.latents_std)
    return torch.cat([video.flatten(), audio.flatten()]).float()


@pytest.mark.parametrize("guided", [True, False])
def test_zero_noise_reproduces_the_stock_pipeline(guided):
    policy = make(guided)
    latents, completion = ode_sample(policy)
    assert torch.allclose(latents, packed(policy.pipe, stock_call(policy.pipe, guided)), atol=1e-5)
    stock = stock_call(policy.pipe, guided, "np")
    frames = np.stack([np.asarray(f) for f in completion["frames"]]) / 255.0
    assert frames.shape == stock.frames[0].shape and np.abs(frames - stock.frames[0]).max() <= 0.5 / 255 + 1e-6
    assert completion["sampling_rate"] == policy.pipe.vocoder.config.output_sampling_rate == 400
    wave = stock.audio[0].float().mean(0).numpy()
    assert completion["array"].shape == wave.shape and np.abs(completion["array"] - wave).max() < 1e-5


def test_sampler_logprobs_are_the_training_forwards_over_video_and_audio():
    policy = make(True)
    batch = policy.rollout([PROMPT, "rain on a roof"], 2, seeds=[5, 6])
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    # step k's log-density, by hand: log N(x_{k+1}; mean, std^2) summed over the video latents' dims and
    # the audio latents' dims, divided by their number (the mean over both)
    k = int(mask[0].nonzero()[0])
    with torch.no_grad():
        mean, std = policy.step_means(policy.model, batch, k, torch.arange(len(batch.group_id)))
    x_next = batch.extras["latents"][:, k + 1].float()
    gauss = torch.distributions.Normal(mean.float(), std)
    parts = [p.flatten(1) for p in policy.family._split(gauss.log_prob(x_next))]  # (video dims, audio dims)
    assert parts[1].shape[1] > 0
    by_hand = (parts[0].sum(1) + parts[1].sum(1)) / (parts[0].shape[1] + parts[1].shape[1])
    assert torch.allclose(new[:, k].detach(), by_hand, atol=1e-5)
    assert not torch.allclose(parts[0].mean(1), by_hand, atol=1e-5)  # the audio dims count


METHODS = {m: FLOW_METHODS[m] for m in ("flow_grpo", "flow_grpo_cps", "dance_grpo", "grpo_guard")}


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_takes_an_on_policy_step(method, tmp_path):
    assert on_policy_step_changes(Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", *METHODS[method]])))


def test_trained_lora_loads_in_the_stock_pipeline(tmp_path):
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", "optim.lora.r=4", "optim.lr=0.05"]))
    t.train()
    ours, completion = ode_sample(t.policy)
    pipe = tiny_ltx2()  # the stock pipeline, as users build it
    base = packed(pipe, stock_call(pipe))
    pipe.load_lora_weights(latest_checkpoint(tmp_path) / "model")
    tuned = packed(pipe, stock_call(pipe))
    assert (tuned - base).abs().max() > 1e-3  # the LoRA changes the stock pipeline's output
    assert torch.allclose(tuned, ours, atol=1e-5), (tuned - ours).abs().max()
    wave = stock_call(pipe, output_type="np").audio[0].float().mean(0).numpy()
    assert np.abs(wave - completion["array"]).max() < 1e-5


def test_recipe_trains_two_steps_with_clap(tmp_path):
    """t2av_ltx2.yaml and i2av_ltx2.yaml as shipped, a tiny random CLAP registered as their judge of the sound."""
    from tiny_audio_judges import tiny_clap
    from mmrl.rewards.audio_models import register_audio_model
    register_audio_model("clap", "tiny-clap", *tiny_clap())
    shipped_recipe_trains_two_steps("t2av_ltx2", tmp_path, overrides=["rewards.clap.args.model=tiny-clap"])
    shipped_recipe_trains_two_steps("i2av_ltx2", tmp_path / "i2av", overrides=["rewards.clap.args.model=tiny-clap"])


def test_fps_sets_the_sound_length():
    policy = make(False, fps=12)
    assert len(policy.rollout([PROMPT], 1, seeds=[1]).completions[0]["array"]) > len(ode_sample(make(False))[1]["array"])
    assert math.isclose(policy.family.frame_rate, 12.0)


def test_rewards_score_the_sound_the_picture_and_both():
    """`clap` (an audio reward, a tiny random CLAP) reads the sound track, `temporal_consistency` (a video
    reward) the frames, as they score the parts alone; `av_sync` reads both; the reward kinds are checked."""
    from tiny_audio_judges import tiny_clap
    from mmrl.core.scoring import REWARD_OUTPUTS, get_reward
    from mmrl.rewards.audio_models import register_audio_model
    from mmrl.rewards.av_sync import av_sync
    from mmrl.rewards.clap import clap
    from mmrl.rewards.video_temporal import temporal_consistency
    register_audio_model("clap", "tiny-clap", *tiny_clap())
    policy = make(False)
    rollout = policy.rollout([PROMPT], 2, seeds=[3])
    both = rollout.completions
    sound = [{"array": c["array"], "sampling_rate": c["sampling_rate"]} for c in both]
    assert clap([PROMPT] * 2, both, model="tiny-clap") == clap([PROMPT] * 2, sound, model="tiny-clap")
    frames = [c["frames"] for c in both]
    assert temporal_consistency([PROMPT] * 2, both, embedding="pixels") == \
        temporal_consistency([PROMPT] * 2, frames, embedding="pixels")
    scores = av_sync([PROMPT] * 2, both, fps=rollout.columns["fps"])
    assert all(0.0 <= s <= 1.0 for s in scores)
    kind = type(policy).output_kind(policy.cfg)
    assert kind == "audio_video" and get_reward("av_sync") is av_sync
    assert all(kind in REWARD_OUTPUTS[name] for name in ("av_sync", "clap", "clip", "colour_shape"))
    assert "image" not in REWARD_OUTPUTS["av_sync"]


IMAGE_ROW = {"prompt": PROMPT, "image": Image.new("RGB", (40, 24), (200, 30, 30))}


@pytest.mark.parametrize("guided", [True, False])
def test_image_to_video_at_zero_noise_is_the_stock_call(guided):
    """LTX2ImageToVideoPipeline: the image's latent frame first and clean, the other frames and the sound
    denoised; the stock call's latents (its first frame the image's), frames and waveform."""
    policy = make(guided, model="tiny:ltx2-i2v", image_column="image", noise_level=0.0)
    rollout = policy.rollout([IMAGE_ROW], 1, seeds=[SEED])
    pipe, scale = policy.pipe, SCALE if guided else 1.0
    args = dict(image=IMAGE_ROW["image"], prompt=[PROMPT], height=SIZE, width=SIZE, num_frames=FRAMES, frame_rate=24.0,
                num_inference_steps=STEPS, guidance_scale=scale, audio_guidance_scale=scale, stg_scale=0.0,
                audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0, guidance_rescale=0.0,
                audio_guidance_rescale=0.0)
    stock = packed(pipe, pipe(**args, generator=torch.Generator().manual_seed(SEED), output_type="latent"))
    first = rollout.extras["pos/first"][0].flatten()  # the image's latent frame, outside the unit
    ours = torch.cat([first, rollout.extras["latents"][0, -1]])
    assert torch.allclose(ours, stock, atol=1e-5), (ours - stock).abs().max()
    out = pipe(**args, generator=torch.Generator().manual_seed(SEED), output_type="np")
    frames = np.stack([np.asarray(f) for f in rollout.completions[0]["frames"]]) / 255.0
    assert np.abs(frames - out.frames[0]).max() <= 0.5 / 255 + 1e-6
    assert np.abs(rollout.completions[0]["array"] - out.audio[0].float().mean(0).numpy()).max() < 1e-5


def test_image_to_video_logprobs_are_the_training_forwards():
    policy = make(True, model="tiny:ltx2-i2v", image_column="image")
    batch = policy.rollout([IMAGE_ROW, {**IMAGE_ROW, "prompt": "rain"}], 2, seeds=[5, 6])
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
