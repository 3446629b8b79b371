"""2026's generator families on their tiny random pipelines (`tasks/demos/tiny_generators.py`):
the ODE path equals the stock pipeline's call (with its own guidance), the sampler's log-probs
equal the training forward's, every training method takes an on-policy step, and a trained LoRA
loads in the stock pipeline (and merged, `mmrl export --merge`) and draws what the policy drew."""

import math

import numpy as np
import pytest
import torch
from helpers import FLOW_METHODS, on_policy_step_changes, shipped_recipe_trains_two_steps
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.model_loading import TINY_MODELS
from test_diffusion import RECIPE

from mmrl.cli.main import main
from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.train.safety.checkpoint import latest_checkpoint

SIZE, STEPS, SEED, PROMPT, SCALE = 16, 3, 7, "red circle", 4.5


def qwen_image_call(pipe, guided, output_type="latent"):
    """QwenImagePipeline's call: true CFG is a negative prompt with true_cfg_scale > 1."""
    return pipe([PROMPT], negative_prompt=[""] if guided else None, true_cfg_scale=SCALE if guided else 1.0,
                num_inference_steps=STEPS, height=SIZE, width=SIZE, generator=torch.Generator().manual_seed(SEED),
                output_type=output_type).images


def z_image_call(pipe, guided, output_type="latent"):
    """ZImagePipeline's call: CFG is on when guidance_scale > 0 (pos + g (pos - neg))."""
    return pipe([PROMPT], guidance_scale=SCALE if guided else 0.0, num_inference_steps=STEPS, height=SIZE,
                width=SIZE, generator=torch.Generator().manual_seed(SEED), output_type=output_type).images


def flux2_klein_call(pipe, guided, output_type="latent"):
    """Flux2KleinPipeline's call (its first argument is a conditioning image): CFG when guidance_scale > 1."""
    return pipe(prompt=[PROMPT], guidance_scale=SCALE if guided else 1.0, num_inference_steps=STEPS, height=SIZE,
                width=SIZE, generator=torch.Generator().manual_seed(SEED), output_type=output_type).images


# tiny pipeline -> (the stock call with the policy's evaluation settings, whether it takes CFG)
FAMILIES = {"qwen-image": (qwen_image_call, True), "z-image": (z_image_call, True),
            "flux2-klein": (flux2_klein_call, True)}


# FLUX.2 [klein]'s tiny pipeline is the slow one (its 27-layer text encoder reads 512 tokens per
# prompt): its training checks run under -m slow (40-260 s each on the loaded 2-core machine,
# 2026-11-29); the default run keeps its stock-pipeline, log-prob and refusal checks
SLOW_TRAINING = ("flux2-klein",)


def trained_families():
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TRAINING else n for n in FAMILIES]


def make(name, guided, **kw):
    args = dict(model=f"tiny:{name}", height=SIZE, width=SIZE, num_steps=STEPS, eval_num_steps=STEPS,
                sampler="flow_sde", noise_level=0.7, classifier_free_guidance=guided, guidance_scale=SCALE)
    return DiffusionPolicy(DiffusionConfig(**{**args, **kw}))


def policy_sample(policy):
    """The policy's sample at noise 0: (final latents in the form the stock pipeline returns them
    with output_type="latent", image as int16). FLUX.2 returns the VAE's latents, unpacked."""
    policy.cfg.noise_level = 0.0
    rollout = policy.rollout([PROMPT], 1, seeds=[SEED])
    final = rollout.extras["latents"][:1, -1]
    stock_form = getattr(policy.family, "vae_latents", lambda z: z)
    return stock_form(final)[0], np.asarray(rollout.completions[0], dtype=np.int16)


@pytest.mark.parametrize("guided", [True, False])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_zero_noise_reproduces_the_stock_pipeline(name, guided):
    call, takes_cfg = FAMILIES[name]
    if guided and not takes_cfg:
        pytest.skip("guidance-distilled: no CFG")
    policy = make(name, guided)
    ours, image = policy_sample(policy)
    stock = call(policy.pipe, guided)
    assert torch.allclose(ours, stock[0].float(), atol=1e-5), (ours - stock[0]).abs().max()
    assert np.abs(np.asarray(call(policy.pipe, guided, "pil")[0], dtype=np.int16) - image).max() <= 1


@pytest.mark.parametrize("name", list(FAMILIES))
def test_sampler_logprobs_are_the_training_forwards(name):
    policy = make(name, FAMILIES[name][1])
    batch = policy.rollout([PROMPT, "blue square"], 2, seeds=[5, 6])
    assert torch.equal(batch.extras["latents"][0, 0], batch.extras["latents"][1, 0])
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    alone = policy.rollout(["blue square"], 2, seeds=[6])  # the padded text: rows drawn apart join
    assert torch.allclose(alone.extras["latents"], batch.extras["latents"][2:], atol=1e-5)
    assert policy.concat([alone, batch]).extras["pos/embeds"].shape[0] == 6


def recipe_overrides(name, tmp_path, *more):
    guided = FAMILIES[name][1] and "policy.classifier_free_guidance=false" not in more
    return [f"output_dir={tmp_path}", f"policy.model=tiny:{name}", f"policy.height={SIZE}", f"policy.width={SIZE}",
            f"policy.num_steps={STEPS}", f"policy.eval_num_steps={STEPS}", f"policy.guidance_scale={SCALE}",
            f"policy.classifier_free_guidance={str(guided).lower()}", f"data.args.size={SIZE}", *more]


# each training method as recipe overrides (the t2i recipes' settings on the tiny model)
METHODS = FLOW_METHODS


# the default run takes Flow-GRPO and DanceGRPO on each family (what differs between families is
# the denoiser call, which every method makes alike); the rest, 4-25 s each on the loaded 2-core
# machine (2026-11-29), under -m slow
DEFAULT_METHODS = ("flow_grpo", "dance_grpo")


@pytest.mark.parametrize("method", [m if m in DEFAULT_METHODS else pytest.param(m, marks=pytest.mark.slow)
                                    for m in METHODS])
@pytest.mark.parametrize("name", trained_families())
def test_every_method_takes_an_on_policy_step(name, method, tmp_path):
    t = Trainer(parse_config(RECIPE, recipe_overrides(name, tmp_path, *METHODS[method])))
    assert on_policy_step_changes(t)


@pytest.mark.slow  # 8-14 s each on the loaded 2-core machine (2026-11-29); the SD3 / FLUX.1 NFT tests stay in the default run
@pytest.mark.parametrize("name", list(FAMILIES))
def test_diffusion_nft_trains_on_the_forward_process(name, tmp_path):
    t = Trainer(parse_config(RECIPE, recipe_overrides(name, tmp_path, "policy.units=forward_process",
                                                      "policy.sampler=ode", "algorithm.objective=nft",
                                                      "policy.classifier_free_guidance=false",
                                                      "algorithm.beta=1e-4", "algorithm.kl_estimator=closed_form")))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    assert math.isfinite(t.train_step()["loss"])
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters() if p.requires_grad)


@pytest.mark.parametrize("name", trained_families())
def test_trained_lora_loads_in_the_stock_pipeline_and_merged(name, tmp_path):
    call, guided = FAMILIES[name]
    t = Trainer(parse_config(RECIPE, recipe_overrides(name, tmp_path, "optim.lora.r=4", "optim.lr=0.05")))
    t.train()
    checkpoint = latest_checkpoint(tmp_path)
    ours, image = policy_sample(t.policy)
    pipe = TINY_MODELS.get(name)()  # the stock pipeline, as users build it
    base = call(pipe, guided)
    pipe.load_lora_weights(checkpoint / "model")
    tuned = call(pipe, guided)
    assert torch.allclose(tuned[0].float(), ours, atol=1e-5)
    assert (tuned - base).abs().max() > 1e-3  # the LoRA changed the output
    assert np.abs(np.asarray(call(pipe, guided, "pil")[0], dtype=np.int16) - image).max() <= 1
    from diffusers import DiffusionPipeline
    assert main(["export", str(checkpoint), "--merge", str(tmp_path / "merged")]) == 0
    merged = DiffusionPipeline.from_pretrained(tmp_path / "merged")
    assert type(merged) is type(pipe) and torch.allclose(call(merged, guided)[0].float(), ours, atol=1e-5)


@pytest.mark.slow  # 6-12 s on the loaded 2-core machine (2026-11-29): the LoRA test above keeps the export in the default run
@pytest.mark.parametrize("name", list(FAMILIES))
def test_full_fine_tune_is_a_stock_pipeline_directory(name, tmp_path):
    from diffusers import DiffusionPipeline
    call, guided = FAMILIES[name]
    t = Trainer(parse_config(RECIPE, recipe_overrides(name, tmp_path, "optim.lr=0.01")))
    t.train()
    ours, _ = policy_sample(t.policy)
    pipe = DiffusionPipeline.from_pretrained(latest_checkpoint(tmp_path) / "model")
    assert type(pipe) is type(t.policy.pipe)
    assert torch.allclose(call(pipe, guided)[0].float(), ours, atol=1e-5)


# each family's recipe (tasks/recipes/): two steps from it on its tiny model
RECIPES = {"qwen-image": "t2i_qwen_image", "z-image": "t2i_z_image", "flux2-klein": "t2i_flux2_klein"}


@pytest.mark.slow  # 12 s on the loaded 2-core machine (2026-11-29)
@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_trains_two_steps(name, tmp_path):
    shipped_recipe_trains_two_steps(RECIPES[name], tmp_path)


def test_a_distilled_flux2_klein_refuses_cfg():
    from mmrl.tasks.diffusion.flux2_klein import Flux2Klein
    pipe = TINY_MODELS.get("flux2-klein")(distilled=True)
    with pytest.raises(ValueError, match="policy.classifier_free_guidance=false"):
        Flux2Klein(pipe, (SIZE, SIZE)).encode([PROMPT], guided=True)
