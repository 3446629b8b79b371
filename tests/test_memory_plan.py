"""`mmrl plan` (mmrl/experiments/memory_plan.py, tasks/lm/memory_formula.py): the analytic plan of a
causal LM's step against the allocation probe's measure of the same step (scripts/memory_probe.py),
its parts against hand-worked references, what fits, and the families it refuses by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmrl.cli.main import main
from mmrl.config.parse import from_dict, parse_config
from mmrl.config.sections import DistributedConfig
from mmrl.distributed import state_shares
from mmrl.errors import UserError
from mmrl.core.memory_model import MemoryModel, SizeAxis
from mmrl.experiments.memory_plan import MemoryPlan, largest_size, plan_memory, plan_table
from mmrl.registry import ADAPTERS

RECIPES = Path(__file__).resolve().parents[1] / "tasks" / "recipes"
PROMPTS = ["01+20=", "11+21="]  # the step's prompts: 6 tokens each of the character tokenizer


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    from memory_probe import MemoryProbe
    return MemoryProbe


def step_recipe(tmp_path, hidden, vocab, tokens, group=2, **policy):
    """One GRPO step of the tiny Qwen2 (2 layers) on PROMPTS x `group` completions of `tokens` tokens,
    one micro-batch, AdamW, beta 0."""
    from mmrl.core.scoring import REWARDS, register_reward
    if "plan_length" not in REWARDS:
        register_reward("plan_length")(lambda completions, **kw: [float(len(c)) for c in completions])
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return {"task": "causal_lm",
            "policy": {"model": "tiny:qwen2-char", "max_new_tokens": tokens, "min_new_tokens": tokens,
                       "tiny_args": {"hidden": hidden, "layers": 2, "heads": 4, "vocab": vocab,
                                     "max_positions": 8 + tokens}, **policy},
            "data": {"path": str(data)}, "rewards": {"plan_length": {"weight": 1.0}},
            "algorithm": {"group_size": group, "estimator": "grpo", "beta": 0.0},
            "optim": {"lr": 1e-5, "prompts_per_step": len(PROMPTS), "micro_batch_size": len(PROMPTS) * group},
            "logging": {"report_to": ["none"], "progress": False}, "output_dir": str(tmp_path / "out"),
            "max_steps": 2, "save_every": 0}


def measured_peak(recipe, probe_class=None) -> int:
    """The probe's peak over building the trainer and two steps (the second one holds AdamW's state);
    the probe class `probe_class`, else scripts/memory_probe.py's (the caller puts scripts/ on the path)."""
    from mmrl.train.loop.trainer import Trainer
    if probe_class is None:
        from memory_probe import MemoryProbe as probe_class
    torch.manual_seed(0)
    probe = probe_class()
    probe.start()
    try:
        trainer = Trainer(parse_config(recipe))
        trainer.train_step()
        trainer.train_step()
    finally:
        probe.stop()
    return probe.peak


def test_the_plan_predicts_the_probed_step(tmp_path, probe):
    """Hidden 64 with a 32,000-token output layer, 4 completions of 8 tokens: the plan's peak
    within 15% of the probe's."""
    recipe = step_recipe(tmp_path, hidden=64, vocab=32000, tokens=8)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=len(PROMPTS[0]))
    measured = measured_peak(recipe, probe)
    assert plan.peak == pytest.approx(measured, rel=0.15)


@pytest.mark.slow  # 1 to 11 min each under the profiler on the loaded 2-core machine
@pytest.mark.parametrize("hidden,tokens", [(64, 128), (512, 128), (64, 512)])
def test_the_plan_predicts_the_probed_step_at_qwens_vocabulary(tmp_path, probe, hidden, tokens):
    """The measured sizes of docs/benchmarks.md's table: Qwen's 151,936-token vocabulary, hidden 64
    and 512, 128 and 512 completion tokens; within 15%."""
    recipe = step_recipe(tmp_path, hidden=hidden, vocab=151936, tokens=tokens)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=len(PROMPTS[0]))
    assert plan.peak == pytest.approx(measured_peak(recipe, probe), rel=0.15)


def text_plan(tmp_path, overrides=(), processes=1, device=None):
    return plan_memory(parse_config(step_recipe(tmp_path, hidden=64, vocab=1000, tokens=16), list(overrides)),
                       processes, prompt_length=6, device_memory=device)


def test_the_training_state_by_hand(tmp_path):
    """Whole fine-tune on one process: weights, gradients and two AdamW moments of every parameter
    in fp32; the tiny model's parameters counted by hand (tied embedding, 2 layers, GQA 4/2 heads)."""
    hidden, vocab, layers = 64, 1000, 2
    attention = hidden * hidden * 2 + 2 * (hidden * hidden // 2) + hidden + 2 * (hidden // 2)  # q, o; k, v; biases
    layer = attention + 3 * hidden * 4 * hidden + 2 * hidden  # the MLP and two norms
    parameters = vocab * hidden + layers * layer + hidden
    plan = text_plan(tmp_path)
    assert plan.parameters == plan.trainable == parameters
    assert plan.state == {"weights": 4 * parameters, "reference weights": 0, "gradients": 4 * parameters,
                          "optimizer state": 8 * parameters}


def test_lora_trains_the_adapters_alone_and_a_sharding_strategy_divides(tmp_path):
    """LoRA rank 8 on every linear layer but the head: r x (in + out) parameters each, their fp32
    gradients and AdamW state; fsdp on 4 processes keeps a quarter of everything."""
    hidden, r = 64, 8
    per_layer = r * (2 * (hidden + hidden) + 2 * (hidden + hidden // 2) + 3 * (hidden + 4 * hidden))
    plan = text_plan(tmp_path, ["optim.lora.r=8"])
    assert plan.trainable == 2 * per_layer
    assert plan.state["gradients"] == 4 * plan.trainable and plan.state["optimizer state"] == 8 * plan.trainable
    sharded = text_plan(tmp_path, ["optim.lora.r=8", "distributed.strategy=fsdp"], processes=2)
    assert sharded.state["weights"] == plan.state["weights"] // 2
    assert sharded.update["output layer gradient"] == 0 and plan.update["output layer gradient"] == 0


def test_the_strategies_shares():
    assert state_shares(DistributedConfig(strategy="ddp"), 8).weights == 1.0
    assert state_shares(DistributedConfig(strategy="fsdp"), 8).optimizer == 1 / 8
    assert state_shares(DistributedConfig(strategy="zero3", offload=True), 8).gradients == 0.0


def test_a_kl_keeps_a_reference_copy(tmp_path):
    plan = text_plan(tmp_path, ["algorithm.beta=0.04"])
    assert plan.state["reference weights"] == plan.state["weights"]


def test_the_kv_cache_is_the_one_generate_keeps(tmp_path):
    """The formula's KV cache against the bytes of the cache transformers' generate returns for
    4 rows of 6 + 16 tokens (the last token's keys and values are never computed: one position less)."""
    cfg = parse_config(step_recipe(tmp_path, hidden=64, vocab=1000, tokens=16))
    adapter = ADAPTERS.get(cfg.task)
    policy_cfg = from_dict(adapter.Config, cfg.policy, "policy")
    formula = adapter.memory_model(policy_cfg, prompt_length=6)
    model = adapter(policy_cfg).model
    ids = torch.randint(10, 40, (4, 6))
    out = model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False, return_dict_in_generate=True)
    cache = out.past_key_values
    measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert measured == formula.rollout_bytes(4, 2)["KV cache"] * (6 + 16 - 1) // (6 + 16)


def test_checkpointing_keeps_less(tmp_path):
    plain, checkpointed = text_plan(tmp_path), text_plan(tmp_path, ["policy.gradient_checkpointing=true"])
    assert checkpointed.update["activations"] < plain.update["activations"]
    assert checkpointed.activations_other == plain.update["activations"]


def test_the_largest_group_size_fits_and_one_more_does_not(tmp_path):
    device = 200 * 2 ** 20
    plan = text_plan(tmp_path, device=device)
    largest = plan.largest_group_size
    assert largest > 0
    assert text_plan(tmp_path, [f"algorithm.group_size={largest}"]).peak <= device
    assert text_plan(tmp_path, [f"algorithm.group_size={largest + 1}"]).peak > device
    assert "largest group size" in plan_table(plan)


class SquareImages(MemoryModel):
    """A hand formula: a pass keeps 3 fp32 channels of SIDE x SIDE pixels per row, 5 times over."""

    def __init__(self, side: int):
        super().__init__(torch.nn.Linear(1, 1, device="meta"), checkpointing=False)
        self.side = side

    def activation_bytes(self, rows, checkpointing):
        return 5 * rows * 3 * self.side ** 2 * 4

    def update_bytes(self, rows, prompts, trains_head):
        return {"activations": self.activation_bytes(rows, False)}

    def rollout_bytes(self, rows, group_size):
        return {}

    def size_axes(self):
        return {"resolution": SizeAxis(64, lambda step: ({"side": 16 * step}, SquareImages(16 * step)))}


def test_the_largest_resolution_by_hand():
    """4 rows of the hand formula beside 1 MiB of training state in 16 MiB: 60 x side^2 x 4 bytes
    <= 15 MiB gives side <= 256.0 (16 MiB: 16 x 16 steps); one byte less, 240; 1 MiB, none."""
    state, rows = 2 ** 20, 4

    def peak(formula):
        return state + sum(formula.update_bytes(rows, 1, True).values())

    axis = SquareImages(16).size_axes()["resolution"]
    assert peak(SquareImages(256)) == 16 * 2 ** 20
    assert largest_size(axis, peak, 16 * 2 ** 20) == {"side": 256}
    assert largest_size(axis, peak, 16 * 2 ** 20 - 1) == {"side": 240}
    assert largest_size(axis, peak, 2 ** 20) == {}
    plan = MemoryPlan("hand", 1, 1, {"rollout": 4, "update": 4}, {}, {}, {}, {}, 0, False, 0,
                      device_memory=16 * 2 ** 20, largest_group_size=1, largest_micro_batch=1,
                      largest_sizes={"resolution": {"side": 256}, "frames": {}})
    table = plan_table(plan)
    assert "largest resolution: side=256" in table and "largest frames: none fits" in table


@pytest.mark.parametrize("recipe,adapter", [("tts_csm", "CSMPolicy"), ("tts_dia", "DiaPolicy"),
                                            ("tts_omni_talker", "OmniTalkerPolicy"),
                                            ("dlm_diffusion_gemma", "DLMPolicy"),
                                            ("t2v_hunyuan", "DiffusionPolicy"), ("t2i_nft", "DiffusionPolicy")])
def test_a_family_without_a_formula_is_named(recipe, adapter, capsys):
    assert main(["plan", recipe, "--prompt-tokens", "16"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and adapter in err and "no memory formula" in err


def test_whole_logits_are_refused(tmp_path):
    with pytest.raises(UserError, match="policy.logprobs_from='logits'"):
        text_plan(tmp_path, ["policy.logprobs_from=logits"])


def test_the_command_prints_json_and_asks_for_the_prompt_length(capsys):
    assert main(["plan", "text_demo", "--prompt-tokens", "16", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["peak"] == sum(plan["state"].values()) + max(sum(plan["update"].values()), sum(plan["rollout"].values()))
    assert main(["plan", "text_demo"]) != 0
    assert "--prompt-tokens" in capsys.readouterr().err


def test_a_configuration_file_alone_is_planned(tmp_path):
    """A directory holding only Qwen2.5-0.5B's config.json (no weights): its 494,032,768 parameters
    (the count its model card gives) and a 16-bit training state of that size."""
    from transformers import Qwen2Config
    Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True).save_pretrained(tmp_path / "qwen")
    plan = text_plan(tmp_path, [f"policy.model={tmp_path / 'qwen'}", "policy.dtype=bfloat16"])
    assert plan.parameters == 494_032_768
    assert plan.state["weights"] == 2 * 494_032_768 and plan.state["optimizer state"] == 4 * 494_032_768


def test_a_model_that_cannot_be_read_is_one_line(capsys):
    assert main(["plan", "text_demo", "policy.model=/nonexistent/model", "--prompt-tokens", "4"]) != 0
    assert "Traceback" not in capsys.readouterr().err


def dlm_step_recipe(tmp_path, hidden, vocab, tokens, estimator, **policy):
    """`step_recipe` for the masked diffusion LM (tiny:dlm-char): one block of `tokens` decoded in 2 steps."""
    recipe = step_recipe(tmp_path, hidden=hidden, vocab=vocab, tokens=tokens)
    recipe["task"] = "dlm"
    recipe["policy"] = {"model": "tiny:dlm-char", "gen_length": tokens, "block_length": tokens, "steps": 2,
                        "estimator": estimator, "tiny_args": {"hidden": hidden, "layers": 2, "heads": 4, "vocab": vocab,
                                                              "max_positions": 16 + tokens}, **policy}
    return recipe


def probed_dlm_step(recipe, probe_class) -> tuple[int, int]:
    """(the probe's peak over building the trainer and two steps, the peak of their updates)."""
    from mmrl.train.loop.trainer import Trainer
    torch.manual_seed(0)
    probe = probe_class()
    probe.start()
    try:
        trainer = Trainer(parse_config(recipe))
        probe.phase(trainer.updater, "accumulate_gradients", "update")
        trainer.train_step()
        trainer.train_step()
    finally:
        probe.stop()
    return probe.peak, probe.phases["update"]["peak"]


@pytest.mark.parametrize("estimator,logprobs_from", [("elbo", "logits"), ("diffu_grpo", "hidden_states")])
def test_the_masked_dlm_plan_predicts_the_probed_step(tmp_path, probe, estimator, logprobs_from):
    """A masked diffusion LM's step (hidden 64, a 32,000-token output layer, 4 completions of 32
    tokens): the whole peak (a decoding step's sampler) and, apart, the update's (the views' graphs
    and the head's backward, the training state of the second step under it) within 15% of the probe."""
    recipe = dlm_step_recipe(tmp_path, 64, 32000, 32, estimator, logprobs_from=logprobs_from)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=len(PROMPTS[0]))
    peak, update = probed_dlm_step(recipe, probe)
    assert plan.peak == pytest.approx(peak, rel=0.15)
    assert sum(plan.state.values()) + sum(plan.update.values()) == pytest.approx(update, rel=0.15)


@pytest.mark.slow  # ~2 min under the profiler on the loaded 2-core machine
def test_the_masked_dlm_plan_where_the_activations_are_the_peak(tmp_path, probe):
    """Hidden 512, the character vocabulary, 512 completion tokens: the views' activations are the
    step's peak; within 15%."""
    recipe = dlm_step_recipe(tmp_path, 512, None, 512, "diffu_grpo")
    plan = plan_memory(parse_config(recipe), 1, prompt_length=len(PROMPTS[0]))
    peak, _ = probed_dlm_step(recipe, probe)
    assert max(plan.update.values()) == plan.update["activations"]
    assert plan.peak == pytest.approx(peak, rel=0.15)


@pytest.mark.parametrize("estimator,settings", [("diffu_grpo", {}), ("elbo", {"elbo_points": 3}),
                                                 ("tracerl", {"steps": 4}), ("espo", {})])
def test_the_views_are_those_the_estimator_runs_on_a_rollout(tmp_path, estimator, settings):
    """The plan's views per pass (a synthetic full-length row on the recipe's schedule) against the
    views the policy's estimator draws on real rollouts of the tiny model (its recorded steps)."""
    from mmrl.tasks.dlm.memory_formula import views_per_pass
    cfg = parse_config(dlm_step_recipe(tmp_path, 64, None, 16, estimator, **settings))
    adapter = ADAPTERS.get("dlm")
    policy_cfg = from_dict(adapter.Config, cfg.policy, "policy")
    policy = adapter(policy_cfg)
    batch = policy.rollout(PROMPTS, 2, [1, 2])
    batch.unit_mask[:] = 1  # every column a unit, as the plan's full-length row
    views = policy.estimate(policy.estimator_inputs(batch))
    assert views_per_pass(policy_cfg, len(PROMPTS[0])) == len(views)


def vlm_recipe(model, side, vision_hidden, hidden, tokens, checkpointing=False):
    """bench_memory_plan's step for the vlm adapter: 2 prompts x 2 completions of `tokens` tokens, one
    `side` x `side` image per prompt (the processor's bound), its chat text 27 tokens."""
    import argparse

    from bench_memory_plan import VLM_PROMPT_TOKENS, recipe
    args = argparse.Namespace(task="vlm", vlm_model=model, vision_hidden=vision_hidden, image_side=side, layers=2,
                              vocab=0, group=2, checkpointing=checkpointing, estimator="diffu_grpo", logprobs_from="logits")
    return recipe(hidden, tokens, args), VLM_PROMPT_TOKENS


def test_the_image_tokens_are_the_processors(tmp_path, probe):
    """The formula's image tokens and patches at the processor's bound against what the processor
    makes of a square image of that size (its pixel values, its image pads)."""
    from PIL import Image

    from mmrl.tasks.model_loading import load_tiny
    recipe, prompt = vlm_recipe("tiny:qwen2.5-vl-char", 224, 32, 64, 8)
    cfg = parse_config(recipe)
    adapter = ADAPTERS.get("vlm")
    formula = adapter.memory_model(from_dict(adapter.Config, cfg.policy, "policy"), prompt)
    _, processor = load_tiny("tiny:qwen2.5-vl-char", {"max_pixels": 224 * 224}, "float32")
    enc = processor(text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[Image.new("RGB", (224, 224))],
                    return_tensors="pt")
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert formula.image_tokens == int((enc["input_ids"] == pad).sum()) == 64
    assert (formula.patches, formula.patch_width) == tuple(enc["pixel_values"].shape)


def test_the_vlm_plan_predicts_the_probed_step(tmp_path, probe):
    """The tiny Qwen2.5-VL (hidden 64, a vision tower of width 64), 224 x 224 images (256 patches),
    4 completions of 32 tokens: the plan's peak within 15% of the probe's."""
    recipe, prompt = vlm_recipe("tiny:qwen2.5-vl-char", 224, 64, 64, 32)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=prompt)
    assert plan.peak == pytest.approx(measured_peak(recipe, probe), rel=0.15)


@pytest.mark.slow  # 6-7 s each under the profiler here (2026-11-29), up to ~15 s on the loaded machine
@pytest.mark.parametrize("model,checkpointing", [("tiny:qwen2-vl-char", False), ("tiny:qwen2.5-vl-char", True)])
def test_the_vlm_plan_at_a_size_it_was_not_fitted_on(tmp_path, probe, model, checkpointing):
    """448 x 448 images (1,024 patches), a vision tower of width 128, hidden 256, 128 completion
    tokens, with and without activation checkpointing: within 15%."""
    recipe, prompt = vlm_recipe(model, 448, 128, 256, 128, checkpointing)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=prompt)
    assert plan.peak == pytest.approx(measured_peak(recipe, probe), rel=0.15)


@pytest.mark.parametrize("setting,named", [("policy.model=tiny:qwen3-vl-char", "qwen3_vl_vision"),
                                           ("policy.episode.tools=[zoom]", "policy.episode.tools")])
def test_what_the_vlm_formula_does_not_model_is_named(setting, named, capsys):
    assert main(["plan", "latex_demo", setting, "--prompt-tokens", "16"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err
