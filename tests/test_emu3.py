"""Emu3 text-to-image (`task: emu3`) against transformers' own generation: the guided sampler's
log-probs against the stock CFG, prefix-constraint and temperature processors applied step by step,
greedy draws against the stock `generate` with the documented prefix function and a negative prompt,
images against the stock VQ-VAE decode and postprocessor, the LoRA in the stock class, the refused
memory plan and the shipped recipe."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Emu3ForConditionalGeneration
from transformers.generation.logits_process import (
    PrefixConstrainedLogitsProcessor,
    TemperatureLogitsWarper,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)

from mmrl.config.parse import load_recipe, parse_config
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS, RECIPES
from mmrl.tasks.demos.tiny_emu3 import tiny_emu3
from mmrl.train.loop.trainer import Trainer

PROMPTS = ["red disc", "a green square on a blue ground"]  # two lengths: the batch pads one on the left
NEGATIVE = "blurry"
COMMON = ["logging.progress=false", "logging.report_to=[none]"]


def policy(**settings):
    adapter = ADAPTERS.get("emu3")
    return adapter(adapter.Config(model="tiny:emu3", image_area=1024, negative_prompt=NEGATIVE, **settings))


def allowed_tokens(pol):
    """The constraint of Emu3's documented generation as a `prefix_allowed_tokens_fn`: counted from
    the image header's last token, each row's W positions take the visual tokens and the next the
    row end; after H rows the end-of-frame, end-of-image and eos tokens."""
    tok, h, w = pol.processor.tokenizer, pol.height, pol.width
    visual = pol.emu3.model.vocabulary_mapping.image_tokens
    tail = [tok.eof_token_id, tok.eoi_token_id, tok.eos_token_id]

    def allowed(batch_id: int, ids: torch.Tensor) -> list[int]:
        drawn = ids.shape[0] - 1 - int((ids == tok.image_wrapper_token_id).nonzero()[0, 0])
        if drawn >= h * (w + 1):
            return [tail[min(drawn - h * (w + 1), 2)]]
        return [pol.row_end] if drawn % (w + 1) == w else visual
    return allowed


def unpadded(pol, prompt: str, text: str | None = None) -> dict:
    return pol.processor(text=[text if text is not None else prompt], return_for_image_generation=True,
                         image_area=1024, return_tensors="pt")


def stock_logprobs(pol, prompt: str, tokens: torch.Tensor, scale: float, temperature: float) -> torch.Tensor:
    """One row's log-probs [H x W] of its visual tokens, walking every generated position without a
    cache: transformers' unbatched CFG processor (which runs the negative prompt itself), the prefix
    constraint and the temperature warper on the full vocabulary's logits, then a log-softmax."""
    model, cond, neg = pol.model, unpadded(pol, prompt)["input_ids"], unpadded(pol, prompt, NEGATIVE)["input_ids"]
    guide = UnbatchedClassifierFreeGuidanceLogitsProcessor(scale, model, unconditional_ids=neg, use_cache=False)
    constrain, warp = PrefixConstrainedLogitsProcessor(allowed_tokens(pol), 1), TemperatureLogitsWarper(temperature)
    visual = pol.visual[tokens]
    fed, out, w = cond, [], pol.width
    for k in range(len(tokens)):
        for forced in ([pol.row_end] if k and k % w == 0 else []) + [int(visual[k])]:
            scores = warp(fed, constrain(fed, guide(fed, model(fed).logits[:, -1].float())))
            if forced != pol.row_end:
                out.append(scores.log_softmax(-1)[0, forced])
            else:  # the row end is the one token its position allows
                assert scores.log_softmax(-1)[0, forced] == 0
            fed = torch.cat([fed, torch.tensor([[forced]])], 1)
    return torch.stack(out)


def test_guided_logprobs_are_the_stock_processors_step_by_step():
    """The units' log-probs (training forward and the sampler's record) equal transformers' unbatched
    CFG (a mix of log-softmaxes over the whole vocabulary), prefix constraint and temperature applied
    to uncached forwards of each row's unpadded prompt and negative prompt; the row ends, forced,
    carry log-prob 0 and are no units."""
    scale, temperature = 3.0, 0.7
    pol = policy(guidance_scale=scale, temperature=temperature)
    batch = pol.rollout(PROMPTS, 2, seeds=[1, 2])
    assert batch.extras["image_tokens"].shape == (4, 16) and batch.unit_mask.shape == (4, 16)
    with torch.no_grad():
        ours = pol.logprobs(pol.model, batch)[0]
        for i in (0, 3):
            reference = stock_logprobs(pol, PROMPTS[i // 2], batch.extras["image_tokens"][i], scale, temperature)
            assert torch.allclose(ours[i], reference, atol=1e-5), f"row {i}"
            assert torch.allclose(batch.rollout_logp[i], reference, atol=1e-5), f"row {i}"


def test_guidance_changes_the_log_probs_and_a_slice_scores_alone():
    """Guidance is applied (scale 1 scores the same tokens otherwise), and a slice of units across a
    row end scores as in the whole pass."""
    guided = policy(guidance_scale=3.0)
    batch = guided.rollout(PROMPTS[:1], 2, seeds=[3])
    plain = policy(guidance_scale=1.0)
    with torch.no_grad():
        a, b = guided.logprobs(guided.model, batch)[0], plain.logprobs(plain.model, batch)[0]
        part = guided.logprobs(guided.model, batch, units=slice(3, 9))[0]
    assert (a - b).abs().max() > 1e-2
    assert torch.allclose(part, a[:, 3:9], atol=1e-5)


def test_greedy_draws_are_the_stock_generate():
    """Greedy rollouts of a padded batch draw the visual tokens of `generate` with the prefix function,
    guidance and negative prompt of Emu3's documented generation, run on each prompt alone; the
    completions are the stock `decode_image_tokens` images as the processor postprocesses them."""
    pol = policy(guidance_scale=3.0)
    batch = pol.rollout(PROMPTS, 1, seeds=[0, 0], greedy=True)
    assert batch.rollout_logp is None
    h, w = pol.height, pol.width
    neg = unpadded(pol, "", NEGATIVE)
    for i, prompt in enumerate(PROMPTS):
        enc = unpadded(pol, prompt)
        stock = pol.model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                   max_new_tokens=h * (w + 1) + 3, do_sample=False, guidance_scale=3.0,
                                   prefix_allowed_tokens_fn=allowed_tokens(pol), negative_prompt_ids=neg["input_ids"],
                                   negative_prompt_attention_mask=neg["attention_mask"])[:, enc["input_ids"].shape[1]:]
        drawn = stock[0, :h * (w + 1)].view(h, w + 1)
        assert (drawn[:, -1] == pol.row_end).all()
        assert torch.equal(drawn[:, :-1].flatten(), pol.visual[batch.extras["image_tokens"][i]]), prompt
        pixels = pol.model.decode_image_tokens(image_tokens=stock, height=h, width=w)
        image = pol.processor.postprocess(list(pixels.float()), return_tensors="PIL.Image.Image")["pixel_values"][0]
        assert np.array_equal(np.asarray(batch.completions[i]), np.asarray(image)), prompt


def test_sampled_draws_depend_on_the_group_seed_alone():
    """A group's tokens come from its own seed; a rollout leaves the model in the mode it found it in."""
    pol = policy()
    pol.model.train()
    both = pol.rollout(PROMPTS, 2, seeds=[5, 6]).extras["image_tokens"]
    alone = pol.rollout(PROMPTS[1:], 2, seeds=[6]).extras["image_tokens"]
    assert torch.equal(both[2:], alone) and not torch.equal(both[:2], both[2:])
    assert pol.model.training


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft 0.21
def test_lora_loads_in_the_stock_class_and_changes_its_greedy_draw(tmp_path):
    """The engine's LoRA saved by the policy loads as a PeftModel on a stock Emu3ForConditionalGeneration,
    scores as the trained policy does, and its greedy image differs from the base model's."""
    from peft import PeftModel
    t = Trainer(parse_config({
        "task": "emu3", "policy": {"model": "tiny:emu3", "image_area": 1024, "negative_prompt": NEGATIVE},
        "seed": 0, "max_steps": 1, "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 16}},
        "rewards": {"mean_red": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "image_reward.py")],
        "algorithm": {"group_size": 4}, "optim": {"lr": 5e-2, "prompts_per_step": 2, "lora": {"r": 4, "alpha": 8}}},
        [f"output_dir={tmp_path / 'run'}", *COMMON]))
    t.train_step()
    t.policy.save_pretrained(t.unwrapped, tmp_path / "lora")
    batch = t.policy.rollout(PROMPTS, 2, seeds=[1, 2])
    base, _ = tiny_emu3()
    assert type(base) is Emu3ForConditionalGeneration
    enc = unpadded(t.policy, PROMPTS[0])
    draw = {"max_new_tokens": 8, "do_sample": False, "guidance_scale": 3.0,
            "prefix_allowed_tokens_fn": allowed_tokens(t.policy)}
    with torch.no_grad():
        before, stock_before = t.policy.logprobs(base, batch)[0], base.generate(**enc, **draw)
        loaded = PeftModel.from_pretrained(base, tmp_path / "lora").eval()
        after, stock_after = t.policy.logprobs(loaded, batch)[0], loaded.generate(**enc, **draw)
        trained = t.policy.logprobs(t.model, batch)[0]
    assert torch.allclose(after, trained, atol=1e-5)
    assert (after - before).abs().max() > 1e-3
    assert not torch.equal(stock_before, stock_after)


def test_bad_settings_are_refused_before_loading(tmp_path):
    """A setting out of range is named before any model loads (the model path does not exist)."""
    with pytest.raises(UserError, match=r"policy\.ratio='16x9': must be W:H"):
        Trainer(parse_config({"task": "emu3", "policy": {"model": str(tmp_path / "absent"), "ratio": "16x9"},
                              "data": {"name": "colour_shapes"}, "rewards": {"colour_shape": {"weight": 1.0}}},
                             [f"output_dir={tmp_path / 'run'}", *COMMON]))


def test_the_memory_plan_refuses_emu3_by_name(tmp_path):
    from mmrl.experiments.memory_plan import plan_memory
    cfg = load_recipe(RECIPES.get("t2i_emu3"), [f"output_dir={tmp_path}", *COMMON])
    with pytest.raises(UserError, match=r"mmrl plan: the adapter Emu3Policy \(Emu3 text-to-image\) has no memory formula"):
        plan_memory(cfg, 1, 64)


def test_shipped_recipe_trains_two_steps(tmp_path):
    trainer = Trainer(load_recipe(RECIPES.get("t2i_emu3"), [
        f"output_dir={tmp_path}", "algorithm.group_size=2", "optim.prompts_per_step=1", "max_steps=2", *COMMON]))
    for _ in range(2):
        metrics = trainer.train_step()
        assert math.isfinite(metrics["loss"]) and metrics["ratio_max_dev"] == 0.0


@pytest.mark.slow  # 74 s on the loaded 2-core machine (2026-11-30): two launches of two steps
def test_one_and_two_processes_give_the_same_weights(tmp_path):
    """1 process and 2 (gloo on CPU, the default data-parallel strategy): the same rewards, loss and
    weights after two steps with a KL to the frozen reference (the visual tokens' embeddings and the
    text head run inside the wrapped forward), with the harness and tolerances of tests/test_sharding.py."""
    from test_sharding import one_and_two_processes, write
    recipe = write(tmp_path, {
        "task": "emu3", "policy": {"model": "tiny:emu3", "image_area": 1024, "negative_prompt": NEGATIVE},
        "seed": 0, "max_steps": 2, "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 16}},
        "rewards": {"mean_red": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "image_reward.py")],
        "algorithm": {"group_size": 3, "beta": 0.04},
        "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 2},
        "logging": {"report_to": ["none"], "progress": False}})
    one, weights = one_and_two_processes(recipe, tmp_path, 2)
    assert any(r["loss"] != 0 for r in one) and any(r["kl"] > 0 for r in one)  # real updates happened
    assert any("embed_tokens" in k for k in weights)
