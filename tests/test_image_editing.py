"""Instruction-based image editing (`tasks/diffusion/editing.py`: Qwen-Image-Edit and Edit-Plus,
FLUX.1 Kontext) on the tiny random pipelines: the ODE path equals the stock pipeline's call on the same
source image and instruction, the sampler's log-probs equal the training forward's, the training methods take
on-policy steps, a trained LoRA loads in the stock pipeline (and merged) and draws what the policy
drew, and rows without their source image, or sources the family cannot batch, are refused.

The stock QwenImageEditPipeline resizes every source to 1024 x 1024 pixels (Edit-Plus: 1024 x 1024
for the VAE, 384 x 384 for the text encoder); the tests run them with those areas patched to the
tiny recipes' `policy.source_area` (32 x 32), the policy's own setting.
FluxKontextPipeline takes the source at its own size with `_auto_resize=False` (32 x 32 here)."""

import math
import random

import numpy as np
import pytest
import torch
from helpers import FLOW_METHODS, on_policy_step_changes, shipped_recipe_trains_two_steps
from test_diffusion import RECIPE
from mmrl.tasks.demos.synthetic.colour_shapes import draw_shape
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.model_loading import TINY_MODELS

from mmrl.cli.main import main
from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.train.safety.checkpoint import latest_checkpoint

SIZE, AREA, STEPS, SEED, SCALE = 16, 32 * 32, 3, 7, 4.5
INSTRUCTION = "make the circle blue"
# the stock pipeline and the policy agree to float rounding: its text encoder reads one batch of
# prompts, ours one row at a time, padded (1.3e-5 the largest difference seen, 2026-11-29)
ATOL = 5e-5


@pytest.fixture(autouse=True)
def tiny_source_area(monkeypatch):
    """The stock pipelines' source areas (fixed at 1024 x 1024 in their __call__) set to AREA."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as stock
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus
    resize = stock.calculate_dimensions
    monkeypatch.setattr(stock, "calculate_dimensions", lambda area, ratio: resize(AREA, ratio))
    monkeypatch.setattr(plus, "VAE_IMAGE_SIZE", AREA)
    monkeypatch.setattr(plus, "CONDITION_IMAGE_SIZE", AREA)  # the text encoder's view (384 x 384 in the pipeline)


def source(colour="red", shape="circle", size=32, seed=0):
    return draw_shape(colour, shape, size, random.Random(seed))


def qwen_image_edit_call(pipe, image, guided, output_type="latent"):
    """QwenImageEditPipeline's (and QwenImageEditPlusPipeline's) call: true CFG is a negative prompt with
    true_cfg_scale > 1."""
    return pipe(image=[image], prompt=[INSTRUCTION], negative_prompt=[""] if guided else None,
                true_cfg_scale=SCALE if guided else 1.0, num_inference_steps=STEPS, height=SIZE, width=SIZE,
                generator=torch.Generator().manual_seed(SEED), output_type=output_type).images


def flux_kontext_call(pipe, image, guided, output_type="latent"):
    """FluxKontextPipeline's call (guidance as an embedding): the output at SIZE x SIZE (its max_area),
    the source at its own size."""
    return pipe(image=[image], prompt=[INSTRUCTION], guidance_scale=SCALE, num_inference_steps=STEPS, height=SIZE,
                width=SIZE, max_area=SIZE * SIZE, _auto_resize=False, generator=torch.Generator().manual_seed(SEED),
                output_type=output_type).images


# tiny pipeline -> (the stock call with the policy's evaluation settings, whether it takes CFG)
FAMILIES = {"qwen-image-edit": (qwen_image_edit_call, True), "qwen-image-edit-plus": (qwen_image_edit_call, True),
            "flux-kontext": (flux_kontext_call, False)}


def make(name, guided, **kw):
    args = dict(model=f"tiny:{name}", height=SIZE, width=SIZE, num_steps=STEPS, eval_num_steps=STEPS,
                sampler="flow_sde", noise_level=0.7, classifier_free_guidance=guided, guidance_scale=SCALE,
                image_column="image", source_area=AREA)
    return DiffusionPolicy(DiffusionConfig(**{**args, **kw}))


def policy_sample(policy, image):
    """The policy's sample of INSTRUCTION on `image` at noise 0: (final packed latents, image as int16)."""
    policy.cfg.noise_level = 0.0
    rollout = policy.rollout([{"prompt": INSTRUCTION, "image": image}], 1, seeds=[SEED])
    return rollout.extras["latents"][0, -1], np.asarray(rollout.completions[0], dtype=np.int16)


@pytest.mark.parametrize("guided", [True, False])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_zero_noise_reproduces_the_stock_pipeline(name, guided):
    call, takes_cfg = FAMILIES[name]
    if guided and not takes_cfg:
        pytest.skip("guidance-distilled: its true CFG in test_flux_true_cfg.py")
    policy, image = make(name, guided), source()
    ours, drawn = policy_sample(policy, image)
    stock = call(policy.pipe, image, guided)
    assert torch.allclose(ours, stock[0].float(), atol=ATOL), (ours - stock[0]).abs().max()
    assert np.abs(np.asarray(call(policy.pipe, image, guided, "pil")[0], dtype=np.int16) - drawn).max() <= 1
    other, _ = policy_sample(policy, source("green", "square", seed=1))  # the source conditions the edit
    assert (other - ours).abs().max() > 1e-3


@pytest.mark.parametrize("name", list(FAMILIES))
def test_sampler_logprobs_are_the_training_forwards(name):
    policy = make(name, FAMILIES[name][1])
    rows = [{"prompt": INSTRUCTION, "image": source()}, {"prompt": "move the square left", "image": source(seed=2)}]
    batch = policy.rollout(rows, 2, seeds=[5, 6])
    assert batch.extras["pos/source"].shape == (4, 64, 16)  # 32x32 sources: 16x16 latents, 8x8 packed tokens
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    alone = policy.rollout(rows[1:], 2, seeds=[6])  # rows drawn apart join
    assert torch.allclose(alone.extras["latents"], batch.extras["latents"][2:], atol=1e-5)
    assert policy.concat([alone, batch]).extras["pos/embeds"].shape[0] == 6


@pytest.mark.parametrize("name", list(FAMILIES))
def test_sources_of_different_aspect_ratios_and_a_row_without_its_source_are_refused(name):
    policy = make(name, False)
    wide = source().resize((96, 32))  # 3:1
    with pytest.raises(ValueError, match="resize to different latent grids"):
        policy.rollout([{"prompt": INSTRUCTION, "image": source()}, {"prompt": INSTRUCTION, "image": wide}], 1,
                       seeds=[1, 2])
    with pytest.raises(ValueError, match="policy.image_column='image': prompt row 0 has no image"):
        policy.rollout([{"prompt": INSTRUCTION}], 1, seeds=[1])


def test_kontext_sources_take_the_nearest_kontext_resolution_by_default():
    from mmrl.tasks.diffusion.flux_kontext import FluxKontext
    family = FluxKontext(TINY_MODELS.get("flux-kontext")(), (SIZE, SIZE))
    assert family.source_size(source().resize((64, 32))) == (720, 1456)  # 2:1 -> 1456 x 720 (2.02:1)
    assert family.source_size(source()) == (1024, 1024)
    family.set_source_area(AREA)
    assert family.source_size(source().resize((64, 32))) == (20, 44)  # 45 x 23 floored to multiples of 4


def test_source_area_is_refused_by_a_family_without_a_source():
    with pytest.raises(ValueError, match="policy.source_area=1024: QwenImagePipeline takes no source image"):
        DiffusionPolicy(DiffusionConfig(model="tiny:qwen-image", height=SIZE, width=SIZE, num_steps=STEPS,
                                        source_area=1024))


# the tests' image recipe (a continuous reward, `mean_red`) on the editing rows and each tiny editor
def recipe(tmp_path, name, *more):
    guided = FAMILIES[name][1]
    edit = {**RECIPE, "policy": {"model": f"tiny:{name}", "height": SIZE, "width": SIZE, "image_column": "image",
                                 "source_area": AREA, "num_steps": STEPS, "eval_num_steps": STEPS,
                                 "noise_level": 0.7, "guidance_scale": SCALE, "classifier_free_guidance": guided},
            "data": {"name": "shape_edits", "args": {"n_train": 8, "n_eval": 2, "size": 32}}}
    return parse_config(edit, [f"output_dir={tmp_path}", *more])


# the training methods (helpers.FLOW_METHODS) this family's tests take
METHODS = {m: FLOW_METHODS[m] for m in ("flow_grpo", "dance_grpo", "flow_grpo_cps", "grpo_guard", "flow_dppo")}
DEFAULT_METHODS = ("flow_grpo", "dance_grpo")  # the rest under -m slow: the denoiser call is the same


# Edit-Plus differs from Qwen-Image-Edit only in how the source is shown: its training steps run
# under -m slow (4-10 s each on the loaded 2-core machine, 2026-11-29)
@pytest.mark.parametrize("name, method", [
    pytest.param(n, m, marks=[] if m in DEFAULT_METHODS and n != "qwen-image-edit-plus" else [pytest.mark.slow])
    for n in FAMILIES for m in METHODS])
def test_every_method_takes_an_on_policy_step(name, method, tmp_path):
    assert on_policy_step_changes(Trainer(recipe(tmp_path, name, *METHODS[method])))


@pytest.mark.slow  # 10-15 s each on the loaded 2-core machine (2026-11-29)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_diffusion_nft_trains_on_the_forward_process(name, tmp_path):
    t = Trainer(recipe(tmp_path, name, "policy.units=forward_process", "policy.sampler=ode", "algorithm.objective=nft",
                       "policy.classifier_free_guidance=false", "algorithm.beta=1e-4",
                       "algorithm.kl_estimator=closed_form"))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    assert math.isfinite(t.train_step()["loss"])
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters() if p.requires_grad)


# 12-16 s each on the loaded 2-core machine (2026-11-29): Qwen-Image-Edit's stays in the default run
# (the export of an editing LoRA), Edit-Plus's and FLUX.1 Kontext's under -m slow
@pytest.mark.parametrize("name", ["qwen-image-edit", *(pytest.param(n, marks=pytest.mark.slow)
                                                      for n in ("qwen-image-edit-plus", "flux-kontext"))])
def test_trained_lora_loads_in_the_stock_pipeline_and_merged(name, tmp_path):
    from diffusers import DiffusionPipeline
    call, guided = FAMILIES[name]
    t = Trainer(recipe(tmp_path, name, "optim.lora.r=4", "optim.lr=0.05"))
    t.train()
    checkpoint, image = latest_checkpoint(tmp_path), source()
    ours, drawn = policy_sample(t.policy, image)
    pipe = TINY_MODELS.get(name)()  # the stock pipeline, as users build it
    base = call(pipe, image, guided)
    pipe.load_lora_weights(checkpoint / "model")
    tuned = call(pipe, image, guided)
    assert torch.allclose(tuned[0].float(), ours, atol=ATOL), (tuned[0] - ours).abs().max()
    assert (tuned - base).abs().max() > 1e-3  # the LoRA changed the output
    assert np.abs(np.asarray(call(pipe, image, guided, "pil")[0], dtype=np.int16) - drawn).max() <= 1
    assert main(["export", str(checkpoint), "--merge", str(tmp_path / "merged")]) == 0
    merged = DiffusionPipeline.from_pretrained(tmp_path / "merged")
    assert type(merged) is type(pipe)
    assert torch.allclose(call(merged, image, guided)[0].float(), ours, atol=ATOL)


@pytest.mark.slow  # 8-10 s each on the loaded 2-core machine (2026-11-29)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_full_fine_tune_is_a_stock_pipeline_directory(name, tmp_path):
    from diffusers import DiffusionPipeline
    call, guided = FAMILIES[name]
    t = Trainer(recipe(tmp_path, name, "optim.lora=null", "optim.lr=0.01"))
    t.train()
    image = source()
    ours, _ = policy_sample(t.policy, image)
    pipe = DiffusionPipeline.from_pretrained(latest_checkpoint(tmp_path) / "model")
    assert type(pipe) is type(t.policy.pipe)
    assert torch.allclose(call(pipe, image, guided)[0].float(), ours, atol=ATOL)


RECIPES_OF = {"qwen-image-edit": "edit_qwen_image", "qwen-image-edit-plus": "edit_qwen_image_plus",
              "flux-kontext": "edit_flux_kontext"}


@pytest.mark.slow  # 7-13 s each on the loaded 2-core machine (2026-11-29)
@pytest.mark.parametrize("name", list(RECIPES_OF))
def test_recipe_trains_two_steps(name, tmp_path):
    shipped_recipe_trains_two_steps(RECIPES_OF[name], tmp_path)
