"""Janus(-Pro) text-to-image (`task: janus`) against transformers' own generation: the guided
sampler's log-probs against the stock logits processors applied step by step, greedy draws against
the stock `generate`, images against the stock decoder and postprocessor, the LoRA in the stock
class, and the shipped recipe."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import JanusForConditionalGeneration, JanusImageProcessor
from transformers.generation.logits_process import (
    ClassifierFreeGuidanceLogitsProcessor,
    TemperatureLogitsWarper,
)

from mmrl.config.parse import load_recipe, parse_config
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS, RECIPES
from mmrl.tasks.demos.tiny_janus import tiny_janus
from mmrl.train.loop.trainer import Trainer

PROMPTS = ["red disc", "a green square on a blue ground"]  # two lengths: the batch pads one on the left
COMMON = ["logging.progress=false", "logging.report_to=[none]"]


def policy(**settings):
    adapter = ADAPTERS.get("janus")
    return adapter(adapter.Config(model="tiny:janus", **settings))


def stock_logprobs(model, ids: torch.Tensor, uncond: torch.Tensor, tokens: torch.Tensor, scale: float,
                   temperature: float) -> torch.Tensor:
    """One row's log-probs [T] of its image tokens, step by step without a cache: the conditional and
    unconditional rows through the decoder alone, scored by the generation head, then transformers'
    CFG processor and temperature warper, then a log-softmax."""
    cfg, warp = ClassifierFreeGuidanceLogitsProcessor(scale), TemperatureLogitsWarper(temperature)
    out = []
    for t in range(tokens.shape[0]):
        rows = []
        for prompt in (ids, uncond):
            embeds = torch.cat([model.get_input_embeddings()(prompt[None]),
                                model.prepare_embeddings_for_image_generation(tokens[None, :t])], 1)
            hidden = model.model.language_model(inputs_embeds=embeds).last_hidden_state[:, -1]
            rows.append(model.model.generation_head(hidden))
        scores = warp(ids[None], cfg(ids[None], torch.cat(rows).float()))
        out.append(scores.log_softmax(-1)[0, tokens[t]])
    return torch.stack(out)


def test_guided_logprobs_are_the_stock_processors_step_by_step():
    """The units' log-probs (training forward and the sampler's record) equal transformers' CFG and
    temperature processors applied to uncached, unbatched forwards of each row's unpadded prompt."""
    scale, temperature = 3.0, 0.7
    pol = policy(guidance_scale=scale, temperature=temperature)
    batch = pol.rollout(PROMPTS, 2, seeds=[1, 2])
    with torch.no_grad():
        ours = pol.logprobs(pol.model, batch)[0]
        for i in range(len(batch)):
            keep = batch.extras["prompt_mask"][i].bool()
            ids, uncond = batch.extras["prompt_ids"][i][keep], batch.extras["uncond_ids"][i][keep]
            reference = stock_logprobs(pol.model, ids, uncond, batch.extras["image_tokens"][i], scale, temperature)
            assert torch.allclose(ours[i], reference, atol=1e-5), f"row {i}"
            assert torch.allclose(batch.rollout_logp[i], reference, atol=1e-5), f"row {i}"
    # the unconditional rows keep only the begin-of-image token (the tiny tokenizer adds no bos)
    boi = pol.tokenizer.convert_tokens_to_ids("<begin_of_image>")
    kept = batch.extras["uncond_ids"][batch.extras["prompt_mask"].bool()]
    assert set(kept.tolist()) == {boi, pol.tokenizer.pad_token_id}


def test_guidance_changes_the_log_probs():
    """Guidance is applied: the same tokens score otherwise at scale 1 (the conditional logits alone)."""
    guided = policy(guidance_scale=5.0)
    batch = guided.rollout(PROMPTS[:1], 2, seeds=[3])
    plain = policy(guidance_scale=1.0)
    with torch.no_grad():
        a, b = guided.logprobs(guided.model, batch)[0], plain.logprobs(plain.model, batch)[0]
    assert (a - b).abs().max() > 1e-2


def test_greedy_draws_are_the_stock_generate():
    """Greedy rollouts of a padded batch draw the tokens of `generate(generation_mode="image")` run on
    each prompt alone, and the completions are the stock VQ decoder's images as the Janus-Pro
    image processor (mean = std = 0.5) postprocesses them."""
    pol = policy(guidance_scale=5.0)
    batch = pol.rollout(PROMPTS, 1, seeds=[0, 0], greedy=True)
    assert batch.rollout_logp is None
    processor = JanusImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    for i, prompt in enumerate(PROMPTS):
        enc = pol.tokenizer([prompt + "<begin_of_image>"], return_tensors="pt")
        stock = pol.model.generate(**enc, generation_mode="image", do_sample=False, guidance_scale=5.0)
        assert torch.equal(stock, batch.extras["image_tokens"][i:i + 1]), prompt
    with torch.no_grad():  # the batch's tokens decoded as one batch, as the rollout decodes them
        pixels = pol.model.decode_image_tokens(batch.extras["image_tokens"]).permute(0, 3, 1, 2)
    images = processor.postprocess(pixels, return_tensors="pt")["pixel_values"].permute(0, 2, 3, 1)
    assert np.array_equal(np.stack([np.asarray(c) for c in batch.completions]), images.numpy())


def test_sampled_draws_depend_on_the_group_seed_alone():
    """A group's tokens come from its own seed; a rollout leaves the model in the mode it found it in."""
    pol = policy()
    pol.model.train()
    both = pol.rollout(PROMPTS, 2, seeds=[5, 6]).extras["image_tokens"]
    alone = pol.rollout(PROMPTS[1:], 2, seeds=[6]).extras["image_tokens"]
    assert torch.equal(both[2:], alone) and not torch.equal(both[:2], both[2:])
    assert pol.model.training


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft 0.21
def test_lora_loads_in_the_stock_class(tmp_path):
    """The engine's LoRA saved by the policy loads as a PeftModel on a stock
    JanusForConditionalGeneration, scores as the trained policy does and differs from the base."""
    from peft import PeftModel
    t = Trainer(parse_config({
        "task": "janus", "policy": {"model": "tiny:janus"}, "seed": 0, "max_steps": 1,
        "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 16}},
        "rewards": {"mean_red": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "image_reward.py")],
        "algorithm": {"group_size": 4}, "optim": {"lr": 5e-2, "prompts_per_step": 2, "lora": {"r": 4, "alpha": 8}}},
        [f"output_dir={tmp_path / 'run'}", *COMMON]))
    t.train_step()
    t.policy.save_pretrained(t.unwrapped, tmp_path / "lora")
    batch = t.policy.rollout(PROMPTS, 2, seeds=[1, 2])
    base, _ = tiny_janus()
    assert type(base) is JanusForConditionalGeneration
    with torch.no_grad():
        before = t.policy.logprobs(base, batch)[0]
        loaded = PeftModel.from_pretrained(base, tmp_path / "lora").eval()
        after = t.policy.logprobs(loaded, batch)[0]
        trained = t.policy.logprobs(t.model, batch)[0]
    assert torch.allclose(after, trained, atol=1e-5)
    assert (after - before).abs().max() > 1e-3


def test_bad_settings_are_refused_before_loading(tmp_path):
    """A setting out of range is named before any model loads (the model path does not exist)."""
    with pytest.raises(UserError, match=r"policy\.guidance_scale=0\.5: must be >= 1"):
        Trainer(parse_config({"task": "janus", "policy": {"model": str(tmp_path / "absent"), "guidance_scale": 0.5},
                              "data": {"name": "colour_shapes"}, "rewards": {"colour_shape": {"weight": 1.0}}},
                             [f"output_dir={tmp_path / 'run'}", *COMMON]))



def test_message_list_prompts_are_refused_by_row_before_loading(tmp_path, no_weights):
    import json

    from mmrl.data import DataError
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "a red disc"}) + "\n" + json.dumps(
        {"prompt": [{"role": "system", "content": "draw"}, {"role": "user", "content": "a red disc"}]}) + "\n")
    with pytest.raises(DataError, match=r"column 'prompt': a list prompt: task janus takes text prompts.*row 1"):
        Trainer(parse_config({"task": "janus", "policy": {"model": "tiny:janus"},
                              "data": {"path": str(rows)}, "rewards": {"colour_shape": {"weight": 1.0}}},
                             [f"output_dir={tmp_path / 'run'}", *COMMON]))

def test_shipped_recipe_trains_two_steps(tmp_path):
    trainer = Trainer(load_recipe(RECIPES.get("t2i_janus"), [
        f"output_dir={tmp_path}", "algorithm.group_size=2", "optim.prompts_per_step=1", "max_steps=2", *COMMON]))
    for _ in range(2):
        metrics = trainer.train_step()
        assert math.isfinite(metrics["loss"]) and metrics["ratio_max_dev"] == 0.0


@pytest.mark.slow  # 24 s on the loaded 2-core machine (2026-11-29): two launches of two steps
def test_one_and_two_processes_give_the_same_weights(tmp_path):
    """1 process and 2 (gloo on CPU, the default data-parallel strategy): the same rewards, loss and
    weights after two steps with a KL to the frozen reference (the image tokens' embeddings and the
    generation head run inside the wrapped forward, so data parallelism reduces their gradients),
    with the harness and tolerances of tests/test_sharding.py."""
    from test_sharding import one_and_two_processes, write
    recipe = write(tmp_path, {
        "task": "janus", "policy": {"model": "tiny:janus", "guidance_scale": 3.0}, "seed": 0, "max_steps": 2,
        "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 16}},
        "rewards": {"mean_red": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "image_reward.py")],
        "algorithm": {"group_size": 3, "beta": 0.04},
        "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 2},
        "logging": {"report_to": ["none"], "progress": False}})
    one, weights = one_and_two_processes(recipe, tmp_path, 2)
    assert any(r["loss"] != 0 for r in one) and any(r["kl"] > 0 for r in one)  # real updates happened
    assert any("generation_embeddings" in k for k in weights)
