"""One unified model thinks and draws (`task: composite` with `policy.shared_weights`, T2I-R1's form):
Janus writes its chain of thought through its language head (`task: janus_text`) and draws image
tokens from it with the same weights (`task: janus`). The sampler's log-probs of both kinds of unit
against the training forward and a hand computation, the gradient of each kind reaching the same
parameters, one LoRA that loads in the stock class and changes both outputs, the checks, the shipped
recipe, and 1 against 2 processes. (The adapter contract on this pairing and on `janus_text` alone is
in tests/test_adapter_contract.py.)"""

from pathlib import Path

import pytest
import torch
from adapter_contract import COMMON

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer

JANUS = {"model": "tiny:janus", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2, "patches": 2}}


def unified_recipe(**policy) -> dict:
    return {"task": "composite",
            "policy": {"thinker_task": "janus_text", "generator_task": "janus", "shared_weights": True,
                       "thinker": {**JANUS, "max_new_tokens": 6}, "generator": {**JANUS, "guidance_scale": 3.0},
                       "thinker_template": "Draw: {prompt}", "prompt_template": "{prompt}. {thought}", **policy},
            "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 8}},
            "rewards": {"colour_shape": {"weight": 1.0}}, "reward_modules": [],
            "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2}}


def trainer(tmp_path: Path, recipe: dict, *overrides: str) -> Trainer:
    return Trainer(parse_config({**COMMON, **recipe}, [f"output_dir={tmp_path}", *overrides]))


THINKER, GENERATOR = slice(0, 6), slice(6, 10)  # the columns of the 6 text tokens and the 2 x 2 image tokens


def test_one_module_serves_both_parts_and_the_prompts_follow_the_templates(tmp_path):
    t = trainer(tmp_path, unified_recipe())
    whole = t.unwrapped
    assert list(whole.parts) == ["thinker"] and whole.part("generator") is whole.part("thinker")
    assert t.policy.parts["generator"].model is t.policy.parts["thinker"].model
    rows = t.inputs.train_rows[:2]
    batch = t.policy.rollout(rows, 3, seeds=[1, 2])
    tokenizer = t.policy.parts["thinker"].tokenizer
    own = [str(r["prompt"]) for r in rows for _ in range(3)]
    assert batch.prompts == own  # the rows' prompts, not the thinker's template
    thinker_prompt = tokenizer.decode(batch.extras["thinker/prompt_ids"][0], skip_special_tokens=True)
    assert thinker_prompt.endswith(f"Draw: {own[0]}")
    drawn_prompt = tokenizer.decode(batch.extras["generator/prompt_ids"][0], skip_special_tokens=True)
    assert drawn_prompt.startswith(f"{own[0]}. {batch.columns['thought'][0]}")
    assert batch.num_units == 10 and batch.unit_mask[:, GENERATOR].all()


def test_the_sampler_log_probs_are_the_training_forwards_and_the_hand_computation(tmp_path):
    """Each kind of unit: the sampler's log-probs (text: the seeded sampler over Janus's `lm_head`;
    image: the guided sampler over its generation head) against the training forward; and the text
    tokens' against a hand computation, the log-softmax of Janus's own logits at the temperature."""
    t = trainer(tmp_path, unified_recipe(thinker={**JANUS, "max_new_tokens": 6, "temperature": 0.7}))
    batch = t.policy.rollout(t.inputs.train_rows[:2], 3, seeds=[3, 4])
    with torch.no_grad():
        logp = t.policy.logprobs(t.model, batch)[0]
    mask = batch.unit_mask.bool()
    for kind in (THINKER, GENERATOR):
        assert mask[:, kind].any()
        gap = (logp[:, kind] - batch.rollout_logp[:, kind]).abs()[mask[:, kind]]
        assert gap.max() < 1e-5, gap.max()
    janus = t.policy.parts["thinker"].model
    ids, prompt_mask = batch.extras["thinker/prompt_ids"], batch.extras["thinker/prompt_mask"]
    completion = batch.extras["thinker/completion_ids"]
    for i in range(len(batch)):
        row = torch.cat([ids[i][prompt_mask[i].bool()], completion[i]])[None]
        with torch.no_grad():
            logits = janus(input_ids=row).logits[0].float() / 0.7
        n = int(mask[i, THINKER].sum())
        hand = logits[-completion.shape[1] - 1:-1].log_softmax(-1).gather(1, completion[i, :, None])[:, 0]
        assert torch.allclose(logp[i, :n], hand[:n], atol=1e-5)


def test_text_units_and_image_units_each_move_the_shared_weights(tmp_path):
    """The gradient of the text tokens' log-probs alone and of the image tokens' alone: both reach the
    same decoder weight; the generation head's weight gets the image's alone (the tiny model ties its
    language head to its text embeddings, which both read)."""
    t = trainer(tmp_path, unified_recipe())
    batch = t.policy.rollout(t.inputs.train_rows[:2], 3, seeds=[1, 2])
    params = dict(t.unwrapped.named_parameters())
    shared = "parts.thinker.model.language_model.layers.0.self_attn.q_proj.weight"
    grads = {}
    for name, kind in (("text", THINKER), ("image", GENERATOR)):
        t.model.zero_grad(set_to_none=True)
        logp = t.policy.logprobs(t.model, batch, kind)[0]
        (logp * batch.unit_mask[:, kind]).sum().backward()
        grads[name] = {n: None if p.grad is None else p.grad.abs().sum().item() for n, p in params.items()}
    head = "parts.thinker.model.generation_head.vision_head.weight"
    assert grads["text"][shared] > 0 and grads["image"][shared] > 0
    assert not grads["text"][head] and grads["image"][head] > 0


def test_one_lora_covers_both_and_loads_in_the_stock_class(tmp_path):
    """`thinker_lora` wraps the one module; after a step its adapter, loaded by PeftModel on the stock
    JanusForConditionalGeneration, scores the batch as the trained policy does and changes both the text
    head's and the generation head's outputs from the untrained model's."""
    from peft import PeftModel

    from mmrl.tasks.composite.model import CompositeModel
    from mmrl.tasks.model_loading import load_tiny
    t = trainer(tmp_path / "run", unified_recipe(thinker_lora={"r": 4, "alpha": 8, "target_modules": "all-linear"}))
    trained = [n for n, p in t.unwrapped.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    t.train_step()
    t.policy.save_pretrained(t.unwrapped, tmp_path / "saved")
    assert (tmp_path / "saved" / "adapter_model.safetensors").exists()
    stock = load_tiny("tiny:janus", JANUS["tiny_args"], "float32")[0]
    loaded = PeftModel.from_pretrained(load_tiny("tiny:janus", JANUS["tiny_args"], "float32")[0], tmp_path / "saved")
    batch = t.policy.rollout(t.inputs.train_rows[:1], 3, seeds=[5])
    with torch.no_grad():
        before = t.policy.logprobs(t.model, batch)[0]
        after = t.policy.logprobs(CompositeModel({"thinker": loaded}, shared={"generator": "thinker"}), batch)[0]
        ids = batch.extras["thinker/prompt_ids"][:1]
        hidden = {name: m.base_model.model.model(input_ids=ids).last_hidden_state if name == "lora"
                  else m.model(input_ids=ids).last_hidden_state for name, m in (("lora", loaded), ("stock", stock))}
        text = {name: (loaded if name == "lora" else stock).lm_head(h) for name, h in hidden.items()}
        image = {name: (loaded.base_model.model if name == "lora" else stock).model.generation_head(h)
                 for name, h in hidden.items()}
    mask = batch.unit_mask.bool()
    assert torch.allclose(before[mask], after[mask], atol=1e-5)
    assert (text["lora"] - text["stock"]).abs().max() > 1e-4
    assert (image["lora"] - image["stock"]).abs().max() > 1e-4


def test_what_sharing_leaves_to_the_thinker_is_checked(tmp_path):
    with pytest.raises(Exception, match=r"policy\.generator_lora\.r=4: with policy\.shared_weights"):
        trainer(tmp_path, unified_recipe(generator_lora={"r": 4}))
    with pytest.raises(Exception, match=r"policy\.generator_lr=0\.1: with policy\.shared_weights"):
        trainer(tmp_path, unified_recipe(generator_lr=0.1))
    with pytest.raises(Exception, match=r"policy\.freeze=generator: with policy\.shared_weights"):
        trainer(tmp_path, unified_recipe(freeze="generator"))
    with pytest.raises(Exception, match=r"policy\.thinker\.rollout_engine=vllm: task janus_text samples with"):
        trainer(tmp_path, unified_recipe(thinker={**JANUS, "rollout_engine": "vllm"}))
    with pytest.raises(Exception, match=r"policy\.thinker_template='\{thought\}' names only \{prompt\}"):
        trainer(tmp_path, unified_recipe(thinker_template="{thought}"))
    qwen = {"model": "tiny:qwen2-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2}, "max_new_tokens": 4}
    with pytest.raises(Exception, match=r"loads a Qwen2ForCausalLM, the generator \(janus\) a "
                                        r"JanusForConditionalGeneration; one module must serve both"):
        trainer(tmp_path, unified_recipe(thinker_task="causal_lm", thinker=qwen))


def test_the_t2i_r1_recipe_trains_two_steps(tmp_path):
    import math

    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES
    t = Trainer(load_recipe(RECIPES.get("t2i_r1_janus"), [
        f"output_dir={tmp_path}", "algorithm.group_size=2", "optim.prompts_per_step=2", "max_steps=2",
        "logging.progress=false", "logging.report_to=[none]"]))
    for _ in range(2):
        metrics = t.train_step()
        assert math.isfinite(metrics["loss"]) and metrics["ratio_max_dev"] == 0.0


@pytest.mark.slow  # 100 s on the loaded 2-core machine (2026-11-30): two launches of two steps
def test_one_and_two_processes_give_the_same_weights(tmp_path):
    """1 process and 2 (gloo on CPU, the default data-parallel strategy): the same rewards, loss and
    weights of the one module after two steps with a KL to the frozen reference, with the harness and
    tolerances of tests/test_sharding.py."""
    from test_sharding import one_and_two_processes, write
    recipe = write(tmp_path, {**unified_recipe(), **COMMON, "max_steps": 2,
                              "algorithm": {"group_size": 3, "beta": 0.04},
                              "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 2},
                              "logging": {"report_to": ["none"], "progress": False}})
    one, weights = one_and_two_processes(recipe, tmp_path, 2)
    assert any(r["loss"] != 0 for r in one) and any(r["kl"] > 0 for r in one)  # real updates happened
    assert weights and all(not k.startswith("generator/") for k in weights)


def test_the_memory_plan_refuses_one_module_for_both_parts():
    """The composite's formula counts each part's module apart: the shared form is refused by name."""
    from mmrl.config.parse import from_dict
    from mmrl.errors import UserError
    from mmrl.tasks.composite.config import CompositeConfig
    from mmrl.tasks.composite.memory_formula import composite_memory
    cfg = from_dict(CompositeConfig, {**unified_recipe()["policy"], "thinker_task": "causal_lm"}, "policy")
    with pytest.raises(UserError, match=r"policy\.shared_weights=true .* has no memory formula"):
        composite_memory(cfg, 16)
