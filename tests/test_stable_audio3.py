"""Stable Audio 3 through the diffusion adapter on its tiny random pipeline (tiny:stable-audio-3):
the ODE path equals the stock pipeline's call (latents and waveform, with and without CFG), the
sampler's log-probs equal the training forward's, the flow methods take an on-policy step, a
trained LoRA loads in the stock pipeline (and merged) and draws what the policy drew, a full
fine-tune is a stock pipeline directory, the recipe trains, and the duration setting is checked."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FLOW_METHODS, on_policy_step_changes
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.model_loading import TINY_MODELS

from mmrl.cli.main import main
from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.train.safety.checkpoint import latest_checkpoint

DURATION, STEPS, SEED, PROMPT, SCALE = 0.25, 3, 7, "rain on a roof", 4.5
RECIPE = {"task": "diffusion",
          "policy": {"model": "tiny:stable-audio-3", "duration": DURATION, "num_steps": STEPS,
                     "eval_num_steps": STEPS, "noise_level": 0.7, "guidance_scale": SCALE},
          "data": {"name": "words_to_say", "args": {"n_train": 8, "n_eval": 2}},
          "rewards": {"loudness": {"weight": 1.0}},
          "reward_modules": [str(Path(__file__).parent / "digit_reward.py")],
          "algorithm": {"group_size": 3, "eps_low": 1e-3, "eps_high": 1e-3},
          "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 6},
          "logging": {"report_to": ["none"], "progress": False}, "max_steps": 1}


def stock_call(pipe, guided, output_type="latent"):
    """StableAudio3Pipeline's call: CFG when guidance_scale > 1, the empty prompt as the negative."""
    return pipe([PROMPT], duration=DURATION, num_inference_steps=STEPS, guidance_scale=SCALE if guided else 1.0,
                generator=torch.Generator().manual_seed(SEED), output_type=output_type).audios


def make(guided, **kw):
    return DiffusionPolicy(DiffusionConfig(**{"model": "tiny:stable-audio-3", "duration": DURATION,
                                              "num_steps": STEPS, "eval_num_steps": STEPS, "sampler": "flow_sde",
                                              "noise_level": 0.7, "classifier_free_guidance": guided,
                                              "guidance_scale": SCALE, **kw}))


def policy_sample(policy):
    """The policy's sample at noise 0: (final latents [C, L], the completion's mono samples)."""
    policy.cfg.noise_level = 0.0
    rollout = policy.rollout([PROMPT], 1, seeds=[SEED])
    return rollout.extras["latents"][0, -1], rollout.completions[0]


def mono(audio):
    return audio[0].float().mean(0).numpy()


@pytest.mark.parametrize("guided", [True, False])
def test_zero_noise_reproduces_the_stock_pipeline(guided):
    policy = make(guided)
    latents, completion = policy_sample(policy)
    stock = stock_call(policy.pipe, guided)
    assert torch.allclose(latents, stock[0].float(), atol=1e-5), (latents - stock[0]).abs().max()
    wave = mono(stock_call(policy.pipe, guided, "pt"))
    assert completion["sampling_rate"] == 800 and completion["array"].shape == (int(DURATION * 800),)
    assert np.abs(completion["array"] - wave).max() < 1e-5


def test_sampler_logprobs_are_the_training_forwards():
    policy = make(True)
    batch = policy.rollout([PROMPT, "a dog barks"], 2, seeds=[5, 6])
    assert torch.equal(batch.extras["latents"][0, 0], batch.extras["latents"][1, 0])
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    alone = policy.rollout(["a dog barks"], 2, seeds=[6])
    assert torch.allclose(alone.extras["latents"], batch.extras["latents"][2:], atol=1e-5)


def test_the_duration_sets_the_length_and_is_checked():
    policy = make(False, duration=0.5)
    assert policy.rollout([PROMPT], 1, seeds=[1]).completions[0]["array"].shape == (400,)
    with pytest.raises(ValueError, match=r"policy.duration=12.0: .* between 0 and 10.0 seconds"):
        make(False, duration=12.0)
    with pytest.raises(ValueError, match=r"policy.duration=1.0: StableDiffusion3Pipeline draws no sound"):
        DiffusionPolicy(DiffusionConfig(model="tiny:sd3", height=32, width=32, duration=1.0))


@pytest.mark.parametrize("override, message", [
    ("policy.duration=12", r"policy.duration=12.0: StableAudio3Pipeline draws between 0 and 10.0 seconds"),
    ("policy.duration=0", r"policy.duration=0.0: StableAudio3Pipeline draws between 0 and 10.0"),
    ("policy.model=tiny:sd3", r"policy.duration=0.25: StableDiffusion3Pipeline draws no sound")])
def test_a_bad_duration_is_refused_before_the_pipeline_loads(override, message, tmp_path, monkeypatch):
    from mmrl.config.parse import ConfigError
    from mmrl.tasks.diffusion import policy
    from mmrl.train.plan.validate import validate
    monkeypatch.setattr(policy, "load_pipeline", None)  # loading would fail
    with pytest.raises(ConfigError, match=message):
        validate(parse_config(RECIPE, overrides(tmp_path, override)))


def overrides(tmp_path, *more):
    return [f"output_dir={tmp_path}", *more]


METHODS = {m: FLOW_METHODS[m] for m in ("flow_grpo", "flow_grpo_cps", "dance_grpo", "mix_grpo", "grpo_guard", "flow_dppo")}


@pytest.mark.parametrize("method", list(METHODS))  # 0.1-2 s each on the loaded 2-core machine (2026-11-29)
def test_every_method_takes_an_on_policy_step(method, tmp_path):
    assert on_policy_step_changes(Trainer(parse_config(RECIPE, overrides(tmp_path, *METHODS[method]))))


def test_diffusion_nft_trains_on_the_forward_process(tmp_path):
    t = Trainer(parse_config(RECIPE, overrides(tmp_path, "policy.units=forward_process", "policy.sampler=ode",
                                               "algorithm.objective=nft", "policy.classifier_free_guidance=false",
                                               "algorithm.beta=1e-4", "algorithm.kl_estimator=closed_form")))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    assert math.isfinite(t.train_step()["loss"])
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters() if p.requires_grad)


def test_trained_lora_loads_in_the_stock_pipeline_and_merged(tmp_path):
    t = Trainer(parse_config(RECIPE, overrides(tmp_path, "optim.lora.r=4", "optim.lr=0.05")))
    t.train()
    checkpoint = latest_checkpoint(tmp_path)
    ours, completion = policy_sample(t.policy)
    pipe = TINY_MODELS.get("stable-audio-3")()  # the stock pipeline, as users build it
    base = stock_call(pipe, True)
    from peft import PeftModel  # diffusers has no LoRA loader for this pipeline: PEFT's, on the stock DiT
    PeftModel.from_pretrained(pipe.transformer, checkpoint / "model")  # injects the LoRA in place
    tuned = stock_call(pipe, True)
    assert torch.allclose(tuned[0].float(), ours, atol=1e-5)
    assert (tuned - base).abs().max() > 1e-3  # the LoRA changed the output
    assert np.abs(mono(stock_call(pipe, True, "pt")) - completion["array"]).max() < 1e-5
    from diffusers import DiffusionPipeline
    assert main(["export", str(checkpoint), "--merge", str(tmp_path / "merged")]) == 0
    merged = DiffusionPipeline.from_pretrained(tmp_path / "merged")
    assert type(merged) is type(pipe) and torch.allclose(stock_call(merged, True)[0].float(), ours, atol=1e-5)


def test_full_fine_tune_is_a_stock_pipeline_directory(tmp_path):
    from diffusers import DiffusionPipeline
    t = Trainer(parse_config(RECIPE, overrides(tmp_path, "optim.lr=0.01")))
    t.train()
    ours, _ = policy_sample(t.policy)
    pipe = DiffusionPipeline.from_pretrained(latest_checkpoint(tmp_path) / "model")
    assert type(pipe) is type(t.policy.pipe)
    assert torch.allclose(stock_call(pipe, True)[0].float(), ours, atol=1e-5)


def test_recipe_trains_two_steps_with_clap(tmp_path):
    """t2a_stable_audio3.yaml as shipped, a tiny random CLAP registered as its judge."""
    from tiny_audio_judges import tiny_clap
    from mmrl.config.parse import load_recipe
    from mmrl.config.recipes import resolve_recipe
    from mmrl.rewards.audio_models import register_audio_model
    register_audio_model("clap", "tiny-clap", *tiny_clap())
    cfg = load_recipe(resolve_recipe("t2a_stable_audio3"), [
        f"output_dir={tmp_path}", "rewards.clap.args.model=tiny-clap", "algorithm.group_size=2",
        "optim.prompts_per_step=1", "max_steps=2", "policy.num_steps=4", "logging.progress=false",
        "logging.report_to=[none]"])
    t = Trainer(cfg)
    assert all("lora_" in n for n, p in t.model.named_parameters() if p.requires_grad)
    for _ in range(2):
        metrics = t.train_step()
        assert metrics["ratio_max_dev"] == 0.0 and math.isfinite(metrics["loss"])
        assert -1.0 <= metrics["reward/clap"] <= 1.0


def test_a_saved_pipelines_duration_range_is_read_before_it_loads(tmp_path):
    from mmrl.tasks.diffusion.pipeline_configs import described_pipeline
    from mmrl.tasks.diffusion.stable_audio3 import StableAudio3
    TINY_MODELS.get("stable-audio-3")().save_pretrained(tmp_path / "sa3")
    described = described_pipeline(DiffusionConfig(model=str(tmp_path / "sa3")))
    assert described.family is StableAudio3 and described.configs["duration_embedder"]["max_val"] == 10.0
    assert "between 0 and 10.0 seconds" in StableAudio3.duration_problem(described.configs, 11.0)
    assert StableAudio3.duration_problem(described.configs, 10.0) is None


@pytest.mark.parametrize("guided", [True, False])
def test_the_distilled_checkpoints_ping_pong_sampler_is_cps_at_full_noise(guided):
    """The stock call with `stochastic_sampling` (x0 = x - s v, then (1 - s') x0 + s' eps: the distilled
    checkpoint's ping-pong sampler) draws what the policy draws with `sampler: cps, noise_level: 1`,
    given the same initial latents and the row's step-noise generator (both draw one eps per step)."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from mmrl.tasks.diffusion.noise import row_seeds
    policy = make(guided, sampler="cps", noise_level=1.0)
    latents = policy.rollout([PROMPT], 1, seeds=[SEED]).extras["latents"][0]
    ping_pong = FlowMatchEulerDiscreteScheduler.from_config(policy.pipe.scheduler.config, stochastic_sampling=True)
    pipe = type(policy.pipe)(**{**policy.pipe.components, "scheduler": ping_pong})
    stock = pipe([PROMPT], duration=DURATION, num_inference_steps=STEPS, guidance_scale=SCALE if guided else 1.0,
                 latents=latents[0][None], generator=torch.Generator().manual_seed(row_seeds([SEED], 1)[0]),
                 output_type="latent").audios
    assert torch.allclose(latents[-1], stock[0].float(), atol=1e-5), (latents[-1] - stock[0]).abs().max()
    assert (latents[-1] - stock_call(policy.pipe, guided)[0]).abs().max() > 1e-2  # not the Euler (ODE) path
