"""HunyuanVideo 1.5 (`HunyuanVideo15Pipeline`) on its tiny random pipeline (`tiny:hunyuan-video-15`):
the ODE path equals the stock call (its guider's CFG, and without it), the sampler's log-probs equal
the training forward's, the training methods take on-policy steps, a trained LoRA loads into the
stock pipeline's transformer (`load_lora_adapter`; the pipeline itself has no LoRA loader) and
merged (`mmrl export --merge`) and draws what the policy drew, a full fine-tune is a stock pipeline
directory, and the recipe trains two steps."""

import math

import numpy as np
import pytest
import torch
from helpers import FLOW_METHODS, on_policy_step_changes, shipped_recipe_trains_two_steps
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.diffusion.saving import LORA_FILE
from mmrl.tasks.demos.tiny_video_generators import tiny_hunyuan_video15
from test_video_diffusion import WAN_RECIPE

from mmrl.cli.main import main
from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.train.safety.checkpoint import latest_checkpoint

SIZE, FRAMES, STEPS, SEED, PROMPT, SCALE = 32, 5, 3, 7, "red circle", 6.0  # SCALE: the tiny pipeline's guider's
# The tiny pipeline is a slow one: every forward reads the pipeline's fixed 1000 text tokens, 256
# glyph tokens and 729 image tokens, and its text model 1108 tokens per prompt. The default run
# keeps the guided stock-pipeline check (6-12 s on the loaded 2-core machine, 2026-11-29); the
# rest, 15-125 s each there (the LoRA test the longest), runs under -m slow.
SLOW = pytest.mark.slow


def make(guided=True, **kw):
    args = dict(model="tiny:hunyuan-video-15", height=SIZE, width=SIZE, num_frames=FRAMES, num_steps=STEPS,
                eval_num_steps=STEPS, sampler="flow_sde", noise_level=0.7, classifier_free_guidance=guided,
                guidance_scale=SCALE)
    return DiffusionPolicy(DiffusionConfig(**{**args, **kw}))


def stock_call(pipe, guided=True, output_type="latent"):
    pipe.guider = pipe.guider.new(enabled=guided)  # the stock pipeline's CFG is its guider's
    return pipe(prompt=[PROMPT], num_inference_steps=STEPS, height=SIZE, width=SIZE, num_frames=FRAMES,
                generator=torch.Generator().manual_seed(SEED), output_type=output_type).frames


def ode_sample(policy):
    policy.cfg.noise_level = 0.0
    rollout = policy.rollout([PROMPT], 1, seeds=[SEED])
    policy.cfg.noise_level = 0.7
    return rollout.extras["latents"][0, -1], rollout.completions[0]


@pytest.mark.parametrize("guided", [True, pytest.param(False, marks=SLOW)])
def test_zero_noise_reproduces_the_stock_pipeline(guided):
    policy = make(guided)
    ours, frames = ode_sample(policy)
    stock = stock_call(policy.pipe, guided)
    assert torch.allclose(ours, stock[0].float(), atol=1e-5), (ours - stock[0]).abs().max()
    stock_frames = stock_call(policy.pipe, guided, "pil")[0]
    assert len(frames) == len(stock_frames) == FRAMES
    assert np.abs(np.asarray(frames[2], dtype=float) - np.asarray(stock_frames[2], dtype=float)).max() <= 1


@SLOW
def test_sampler_logprobs_are_the_training_forwards():
    policy = make()
    batch = policy.rollout([PROMPT, "blue square"], 2, seeds=[5, 6])
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    alone = policy.rollout(["blue square"], 2, seeds=[6])  # rows drawn apart join
    assert torch.allclose(alone.extras["latents"], batch.extras["latents"][2:], atol=1e-5)


def recipe(tmp_path, *overrides):
    return parse_config(WAN_RECIPE, [f"output_dir={tmp_path}", "policy.model=tiny:hunyuan-video-15",
                                     f"policy.guidance_scale={SCALE}", *overrides])


METHODS = FLOW_METHODS
@SLOW  # 13-55 s each (2026-11-29)
@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_takes_an_on_policy_step(method, tmp_path):
    assert on_policy_step_changes(Trainer(recipe(tmp_path, *METHODS[method])))


@SLOW
def test_diffusion_nft_trains_on_the_forward_process(tmp_path):
    t = Trainer(recipe(tmp_path, "policy.units=forward_process", "policy.sampler=ode", "algorithm.objective=nft",
                       "policy.classifier_free_guidance=false", "algorithm.beta=1e-4",
                       "algorithm.kl_estimator=closed_form"))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    assert math.isfinite(t.train_step()["loss"])
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters() if p.requires_grad)


@SLOW  # 73-125 s (2026-11-29)
def test_trained_lora_loads_into_the_stock_transformer_and_merged(tmp_path):
    from diffusers import DiffusionPipeline, HunyuanVideo15Pipeline
    t = Trainer(recipe(tmp_path, "optim.lora.r=4", "optim.lr=0.05"))
    t.train()
    checkpoint = latest_checkpoint(tmp_path) / "model"
    ours, _ = ode_sample(t.policy)
    pipe = tiny_hunyuan_video15()  # the stock pipeline, as users build it
    base = stock_call(pipe)
    pipe.transformer.load_lora_adapter(checkpoint, weight_name=LORA_FILE, prefix="transformer")
    tuned = stock_call(pipe)
    assert (tuned - base).abs().max() > 1e-3  # the LoRA changes the stock pipeline's output
    assert torch.allclose(tuned[0].float(), ours, atol=1e-5), (tuned[0] - ours).abs().max()
    assert main(["export", str(checkpoint.parent), "--merge", str(tmp_path / "merged")]) == 0
    merged = DiffusionPipeline.from_pretrained(tmp_path / "merged")
    assert isinstance(merged, HunyuanVideo15Pipeline)
    assert torch.allclose(stock_call(merged)[0].float(), ours, atol=1e-5)


@SLOW
def test_full_fine_tune_is_a_stock_pipeline_directory(tmp_path):
    from diffusers import DiffusionPipeline, HunyuanVideo15Pipeline
    t = Trainer(recipe(tmp_path, "optim.lr=0.01"))
    t.train()
    ours, _ = ode_sample(t.policy)
    pipe = DiffusionPipeline.from_pretrained(latest_checkpoint(tmp_path) / "model")
    assert isinstance(pipe, HunyuanVideo15Pipeline)
    assert torch.allclose(stock_call(pipe)[0].float(), ours, atol=1e-5)


@SLOW
def test_recipe_trains_two_steps(tmp_path):
    shipped_recipe_trains_two_steps("t2v_hunyuan15", tmp_path, on_policy=False)
