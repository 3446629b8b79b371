"""Qwen-Image-Edit-Plus with several source images a row (`policy.image_column` holding a list): at
noise 0 the policy draws what the stock `QwenImageEditPlusPipeline` call draws with the same list
(the text encoder reads "Picture 1: ... Picture 2: ...", each source's tokens follow the noisy
latents' in order), the sampler's log-probs are the training forward's, rows drawn apart join, and
a list is refused for a family that reads one source, before the model loads and at the rollout."""

import pytest
import torch
from helpers import noiseless_latents
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from test_image_editing import ATOL, INSTRUCTION, SCALE, SEED, SIZE, STEPS, make, source, tiny_source_area  # noqa: F401

from mmrl.data.rows import RowError


def sources():
    """A red circle and a green square of another size (each its own latent grid)."""
    return [source(), source("green", "square", seed=1).resize((48, 32))]


def stock_call(pipe, images, guided):
    return pipe(image=images, prompt=[INSTRUCTION], negative_prompt=[""] if guided else None,
                true_cfg_scale=SCALE if guided else 1.0, num_inference_steps=STEPS, height=SIZE, width=SIZE,
                generator=torch.Generator().manual_seed(SEED), output_type="latent").images


def noiseless(policy, images):
    return noiseless_latents(policy, {"prompt": INSTRUCTION, "image": images}, SEED)


@pytest.mark.parametrize("guided", [True, False])
def test_several_sources_reproduce_the_stock_call_with_the_same_list(guided):
    policy, images = make("qwen-image-edit-plus", guided), sources()
    ours = noiseless(policy, images)
    stock = stock_call(policy.pipe, images, guided)
    assert torch.allclose(ours, stock[0].float(), atol=ATOL), (ours - stock[0]).abs().max()
    assert (noiseless(policy, images[:1]) - ours).abs().max() > 1e-3  # the second source conditions the edit
    assert (noiseless(policy, images[::-1]) - ours).abs().max() > 2e-4  # and its place (9e-4 on the tiny model)


def test_several_sources_sampler_logprobs_are_the_training_forwards():
    policy = make("qwen-image-edit-plus", True)
    rows = [{"prompt": INSTRUCTION, "image": sources()}, {"prompt": "move the square left", "image": sources()[:1]}]
    with pytest.raises(ValueError, match="different latent grids"):  # two sources beside one
        policy.rollout(rows, 2, seeds=[5, 6])
    rows[1]["image"] = [source(seed=2), source("blue", "square", seed=3).resize((48, 32))]
    batch = policy.rollout(rows, 2, seeds=[5, 6])
    assert batch.extras["pos/source_grid"][0].tolist() == [8, 8, 8, 8]  # two sources of 32 x 32 px at AREA: 8 x 8 tokens
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    alone = policy.rollout(rows[1:], 2, seeds=[6])  # rows drawn apart join
    assert torch.allclose(alone.extras["latents"], batch.extras["latents"][2:], atol=1e-5)


@pytest.mark.parametrize("name", ["qwen-image-edit", "flux-kontext"])
def test_a_list_of_sources_is_refused_where_the_family_reads_one(name):
    cfg = DiffusionConfig(model=f"tiny:{name}", height=SIZE, width=SIZE, image_column="image")
    check = DiffusionPolicy.media_columns(cfg)["image"]
    check(source())
    with pytest.raises(RowError, match="column 'image': 2 images: .* conditions each prompt on one image"):
        check(sources())
    plus = DiffusionConfig(**{**vars(cfg), "model": "tiny:qwen-image-edit-plus"})
    DiffusionPolicy.media_columns(plus)["image"](sources())
    with pytest.raises(ValueError, match="policy.image_column='image': prompt row 0: 2 images"):
        make(name, False).rollout([{"prompt": INSTRUCTION, "image": sources()}], 1, seeds=[1])
