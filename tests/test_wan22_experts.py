"""Wan 2.2 A14B's two experts on a tiny random pipeline (`tiny:wan22-a14b`): the ODE path equals
the stock WanPipeline's call (which switches experts at boundary_ratio * 1000), each step goes
through the expert of its timestep in sampling and in training alike, every training method takes
an on-policy step, a LoRA trains both experts and loads into the stock pipeline's `transformer`
and `transformer_2`, full fine-tuning and the merged export are stock pipeline directories."""

import math

import pytest
import torch
from helpers import FLOW_METHODS, noiseless_latents, on_policy_step_changes, shipped_recipe_trains_two_steps
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.experts import TimestepExperts
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.diffusion.saving import expert_lora_file
from mmrl.tasks.demos.tiny_video_generators import tiny_wan22_a14b
from test_video_diffusion import WAN_RECIPE

from mmrl.cli.main import main
from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.train.safety.checkpoint import latest_checkpoint

SIZE, FRAMES, STEPS, SEED, PROMPT, SCALE = 32, 5, 3, 7, "red circle", 4.5
EXPERTS = ("transformer", "transformer_2")


def make(**kw):
    args = dict(model="tiny:wan22-a14b", height=SIZE, width=SIZE, num_frames=FRAMES, num_steps=STEPS,
                eval_num_steps=STEPS, sampler="flow_sde", noise_level=0.7, classifier_free_guidance=True,
                guidance_scale=SCALE)
    return DiffusionPolicy(DiffusionConfig(**{**args, **kw}))


def stock_call(pipe, **kw):
    return pipe(prompt=[PROMPT], num_inference_steps=STEPS, height=SIZE, width=SIZE, num_frames=FRAMES,
                guidance_scale=SCALE, generator=torch.Generator().manual_seed(SEED), output_type="latent",
                **kw).frames


@pytest.fixture(scope="module")
def policy():
    return make()


def test_zero_noise_reproduces_the_stock_pipeline_with_both_experts(policy):
    assert isinstance(policy.model, TimestepExperts) and policy.model.boundary == 875.0
    stock = stock_call(policy.pipe)
    ours = noiseless_latents(policy, PROMPT, SEED)
    assert torch.allclose(ours, stock[0].float(), atol=1e-5), (ours - stock[0]).abs().max()
    # both experts drew it: the high-noise expert alone (no boundary) draws another video
    from diffusers import WanPipeline
    alone = WanPipeline(**{**policy.pipe.components, "transformer_2": None})
    assert (stock_call(alone) - stock).abs().max() > 1e-3


def test_each_row_goes_through_the_expert_of_its_timestep(policy):
    model = policy.model
    x = torch.randn(3, 4, 2, 8, 8)
    text = torch.randn(3, 6, 32)
    t = torch.tensor([999.0, 875.0, 300.0])  # the boundary itself is the high-noise expert's, as in the stock call
    mixed = model(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
    for row, expert in zip(range(3), (model.transformer, model.transformer, model.transformer_2)):
        alone = expert(hidden_states=x[row:row + 1], timestep=t[row:row + 1], encoder_hidden_states=text[row:row + 1],
                       return_dict=False)[0]
        assert torch.allclose(mixed[row:row + 1], alone, atol=1e-6), row
    assert [model.expert_of(v) for v in t.tolist()] == ["transformer", "transformer", "transformer_2"]


def test_a_steps_log_prob_is_the_training_forward_of_its_expert_alone(policy):
    batch = policy.rollout([PROMPT, "blue square"], 2, seeds=[5, 6])
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    timesteps = batch.extras["timesteps"][0]
    assert {policy.model.expert_of(float(v)) for v in timesteps[:2]} == set(EXPERTS)  # steps 0, 1: one each
    for k in (0, 1):  # a trained step's gradient reaches its own expert only
        policy.model.zero_grad()
        policy.logprobs(policy.model, batch, slice(k, k + 1))[0].sum().backward()
        reached = {name for name in EXPERTS
                   if any(p.grad is not None and p.grad.abs().sum() > 0 for p in getattr(policy.model, name).parameters())}
        assert reached == {policy.model.expert_of(float(timesteps[k]))}, k
    policy.model.zero_grad()


LOW_NOISE_SCALE = 2.0  # policy.guidance_scale_2: the low-noise expert's CFG scale


def test_the_low_noise_experts_guidance_scale_is_the_stock_calls_guidance_scale_2():
    policy = make(guidance_scale_2=LOW_NOISE_SCALE)
    ours = noiseless_latents(policy, PROMPT, SEED)
    stock = stock_call(policy.pipe, guidance_scale_2=LOW_NOISE_SCALE)
    assert torch.allclose(ours, stock[0].float(), atol=1e-5), (ours - stock[0]).abs().max()
    assert (stock_call(policy.pipe) - stock).abs().max() > 1e-3  # the second scale changes the video
    batch = policy.rollout([PROMPT, "blue square"], 2, seeds=[5, 6])
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    policy.family.low_noise_scale = None  # scored at one scale: the high-noise step alike, the low-noise one not
    with torch.no_grad():
        one_scale, _ = policy.logprobs(policy.model, batch, slice(0, 2))
    assert [policy.model.expert_of(float(v)) for v in batch.extras["timesteps"][0, :2]] == list(EXPERTS)
    assert torch.equal(one_scale[:, 0], new[:, 0].detach())
    assert (one_scale[:, 1] - new[:, 1]).abs().max() > 2e-5  # 4.6e-5 on this tiny model


def test_a_second_guidance_scale_is_refused_without_a_second_expert_or_cfg():
    one_expert = DiffusionConfig(model="tiny:wan-t2v", height=SIZE, width=SIZE, num_frames=FRAMES,
                                 guidance_scale_2=LOW_NOISE_SCALE)
    assert any("policy.guidance_scale_2 is set: Wan has no low-noise expert" in p
               for p in DiffusionPolicy.config_problems(one_expert))
    assert not DiffusionPolicy.config_problems(DiffusionConfig(**{**vars(one_expert), "model": "tiny:wan22-a14b"}))
    with pytest.raises(ValueError, match="policy.guidance_scale_2=2.0 is a CFG scale"):
        make(guidance_scale_2=LOW_NOISE_SCALE, classifier_free_guidance=False)


def recipe(tmp_path, *overrides):
    return parse_config(WAN_RECIPE, [f"output_dir={tmp_path}", "policy.model=tiny:wan22-a14b",
                                     f"policy.guidance_scale={SCALE}", *overrides])


METHODS = FLOW_METHODS
# Flow-GRPO and DanceGRPO in the default run (the expert routing is the same call in every method);
# the rest under -m slow (a few seconds each on the loaded 2-core machine, 2026-11-29)
DEFAULT_METHODS = ("flow_grpo", "dance_grpo")


@pytest.mark.parametrize("method", [m if m in DEFAULT_METHODS else pytest.param(m, marks=pytest.mark.slow)
                                    for m in METHODS])
def test_every_method_takes_an_on_policy_step(method, tmp_path):
    changed = on_policy_step_changes(Trainer(recipe(tmp_path, *METHODS[method])))
    assert changed


@pytest.mark.slow  # DiffusionNFT's forward-process units, a few seconds (2026-11-29)
def test_diffusion_nft_trains_both_experts(tmp_path):
    t = Trainer(recipe(tmp_path, "policy.units=forward_process", "policy.sampler=ode", "algorithm.objective=nft",
                       "policy.classifier_free_guidance=false", "algorithm.beta=1e-4",
                       "algorithm.kl_estimator=closed_form"))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    assert math.isfinite(t.train_step()["loss"])
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())


def changed_experts(trained, base):
    """The experts whose weights differ between two WanPipelines."""
    return {name for name in EXPERTS
            if any(not torch.equal(p, q) for p, q in zip(getattr(trained, name).parameters(),
                                                            getattr(base, name).parameters()))}


def test_a_lora_per_expert_loads_into_the_stock_pipeline_and_merges_with_export(tmp_path):
    from diffusers import DiffusionPipeline, WanPipeline
    t = Trainer(recipe(tmp_path, "optim.lora.r=4", "optim.lr=0.05"))
    t.train()
    checkpoint = latest_checkpoint(tmp_path) / "model"
    ours = noiseless_latents(t.policy, PROMPT, SEED)
    pipe = tiny_wan22_a14b()  # the stock pipeline, as users build it
    base = stock_call(pipe)
    pipe.load_lora_weights(checkpoint, weight_name=expert_lora_file("transformer"))
    high_only = stock_call(pipe)
    pipe.load_lora_weights(checkpoint, weight_name=expert_lora_file("transformer_2"), load_into_transformer_2=True)
    tuned = stock_call(pipe)
    assert (high_only - base).abs().max() > 1e-3 and (tuned - high_only).abs().max() > 1e-3  # each LoRA matters
    assert torch.allclose(tuned[0].float(), ours, atol=1e-5), (tuned[0] - ours).abs().max()
    assert main(["export", str(checkpoint.parent), "--merge", str(tmp_path / "merged")]) == 0
    merged = DiffusionPipeline.from_pretrained(tmp_path / "merged")
    assert isinstance(merged, WanPipeline) and merged.config.boundary_ratio == pytest.approx(0.875)
    assert changed_experts(merged, tiny_wan22_a14b()) == set(EXPERTS)
    assert torch.allclose(stock_call(merged)[0].float(), ours, atol=1e-5)


def test_full_fine_tune_of_both_experts_is_a_stock_pipeline_directory(tmp_path):
    from diffusers import DiffusionPipeline, WanPipeline
    t = Trainer(recipe(tmp_path, "optim.lr=0.01"))
    t.train()
    ours = noiseless_latents(t.policy, PROMPT, SEED)
    pipe = DiffusionPipeline.from_pretrained(latest_checkpoint(tmp_path) / "model")
    assert isinstance(pipe, WanPipeline) and pipe.transformer_2 is not None
    assert changed_experts(pipe, tiny_wan22_a14b()) == set(EXPERTS)
    assert torch.allclose(stock_call(pipe)[0].float(), ours, atol=1e-5)


@pytest.mark.slow  # two steps of 8 videos x 8 steps through both experts (measured below, 2026-11-29)
def test_recipe_trains_two_steps(tmp_path):
    shipped_recipe_trains_two_steps("t2v_wan22_a14b", tmp_path)
