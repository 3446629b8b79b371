"""Wan 2.2 I2V-A14B's two experts on the tiny random image-to-video pipeline (tiny:wan22-a14b-i2v: no
CLIP image encoder, the switch at 0.9 * 1000): at noise 0 the policy draws what the stock
WanImageToVideoPipeline call draws (with and without a second guidance scale), the sampler's
log-probs are the training forward's, a training step reaches both experts, and the LoRA of each
expert loads into the stock pipeline and draws what the trained policy draws."""

import pytest
import torch
from helpers import noiseless_latents, on_policy_step_changes
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.experts import TimestepExperts
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.diffusion.saving import expert_lora_file
from mmrl.tasks.demos.tiny_video_generators import tiny_wan22_a14b_i2v
from PIL import Image

from mmrl.config.parse import load_recipe
from mmrl.config.recipes import resolve_recipe
from mmrl.train.loop.trainer import Trainer
from mmrl.train.safety.checkpoint import latest_checkpoint

SIZE, FRAMES, STEPS, SEED, PROMPT, SCALE, LOW_NOISE_SCALE = 32, 5, 3, 7, "red circle", 4.5, 2.0
IMAGE = Image.new("RGB", (40, 24), (200, 30, 30))


def make(**kw):
    args = dict(model="tiny:wan22-a14b-i2v", image_column="image", height=SIZE, width=SIZE, num_frames=FRAMES,
                num_steps=STEPS, eval_num_steps=STEPS, sampler="flow_sde", noise_level=0.7,
                classifier_free_guidance=True, guidance_scale=SCALE)
    return DiffusionPolicy(DiffusionConfig(**{**args, **kw}))


def stock_call(pipe, **kw):
    return pipe(image=IMAGE, prompt=[PROMPT], num_inference_steps=STEPS, height=SIZE, width=SIZE, num_frames=FRAMES,
                guidance_scale=SCALE, generator=torch.Generator().manual_seed(SEED), output_type="latent", **kw).frames


def ode_sample(policy):
    return noiseless_latents(policy, {"prompt": PROMPT, "image": IMAGE}, SEED)


@pytest.mark.parametrize("low_noise_scale", [None, LOW_NOISE_SCALE])
def test_zero_noise_reproduces_the_stock_image_to_video_call_with_both_experts(low_noise_scale):
    policy = make(guidance_scale_2=low_noise_scale)
    assert isinstance(policy.model, TimestepExperts) and policy.model.boundary == 900.0
    ours = ode_sample(policy)
    stock = stock_call(policy.pipe, guidance_scale_2=low_noise_scale)
    assert torch.allclose(ours, stock[0].float(), atol=1e-5), (ours - stock[0]).abs().max()
    from diffusers import WanImageToVideoPipeline
    alone = WanImageToVideoPipeline(**{**policy.pipe.components, "transformer_2": None})
    assert (stock_call(alone) - stock).abs().max() > 1e-3  # both experts drew it
    batch = policy.rollout([{"prompt": PROMPT, "image": IMAGE}, {"prompt": "blue square", "image": IMAGE}], 2,
                           seeds=[5, 6])
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)


def recipe(tmp_path, *overrides):
    return load_recipe(resolve_recipe("i2v_wan"), [
        f"output_dir={tmp_path}", "policy.model=tiny:wan22-a14b-i2v", f"policy.num_steps={STEPS}",
        f"policy.eval_num_steps={STEPS}", "policy.schedule={kind: all_but_last}", "optim.prompts_per_step=2",
        "algorithm.group_size=2", "optim.micro_batch_size=4", "max_steps=1", "save_every=1",
        "logging.report_to=[none]", "logging.progress=false", *overrides])


def test_a_step_trains_both_experts_and_each_lora_loads_into_the_stock_pipeline(tmp_path):
    t = Trainer(recipe(tmp_path, "optim.lora.r=4", "optim.lr=0.05"))
    changed = on_policy_step_changes(t)
    assert {name.split(".")[2] for name in changed if "lora" in name} == {"transformer", "transformer_2"}
    t.save_checkpoint()
    checkpoint = latest_checkpoint(tmp_path) / "model"
    t.policy.cfg.guidance_scale = SCALE
    ours = ode_sample(t.policy)
    pipe = tiny_wan22_a14b_i2v()  # the stock pipeline, as users build it
    base = stock_call(pipe)
    pipe.load_lora_weights(checkpoint, weight_name=expert_lora_file("transformer"))
    pipe.load_lora_weights(checkpoint, weight_name=expert_lora_file("transformer_2"), load_into_transformer_2=True)
    tuned = stock_call(pipe)
    assert (tuned - base).abs().max() > 1e-3
    assert torch.allclose(tuned[0].float(), ours, atol=1e-5), (tuned[0] - ours).abs().max()
