"""AudioLDM 2 through the diffusion adapter on its tiny random pipeline (tiny:audioldm2): the DDIM
path equals the stock pipeline's call (latents and waveform, with and without CFG), a prompt draws
alike alone and beside a longer one, the sampler's log-probs equal the training forward's, the
DDPM methods take an on-policy step and the flow-only ones are refused, a trained LoRA loads in the stock
pipeline's UNet and draws what the policy drew (and its merged export is a stock pipeline), the recipe trains with CLAP, the
duration is checked, and `mmrl plan` names the family it has no formula for."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FLOW_METHODS, on_policy_step_changes
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.model_loading import TINY_MODELS

from mmrl.cli.main import main
from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.train.safety.checkpoint import latest_checkpoint

STEPS, SEED, PROMPT, SCALE = 3, 7, "rain on a roof", 3.5
RECIPE = {"task": "diffusion",
          "policy": {"model": "tiny:audioldm2", "num_steps": STEPS, "eval_num_steps": STEPS, "sampler": "ddim",
                     "noise_level": 1.0, "guidance_scale": SCALE},
          "data": {"name": "words_to_say", "args": {"n_train": 8, "n_eval": 2}},
          "rewards": {"loudness": {"weight": 1.0}},
          "reward_modules": [str(Path(__file__).parent / "digit_reward.py")],
          "algorithm": {"group_size": 3, "eps_low": 1e-3, "eps_high": 1e-3},
          "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 6},
          "logging": {"report_to": ["none"], "progress": False}, "max_steps": 1}


def stock_call(pipe, guided, output_type="latent", prompts=(PROMPT,), **kw):
    """AudioLDM2Pipeline's call: CFG when guidance_scale > 1, the empty prompt as the negative."""
    return pipe(list(prompts), num_inference_steps=STEPS, guidance_scale=SCALE if guided else 1.0,
                generator=torch.Generator().manual_seed(SEED), output_type=output_type, **kw).audios


def make(guided, **kw):
    return DiffusionPolicy(DiffusionConfig(**{"model": "tiny:audioldm2", "num_steps": STEPS, "eval_num_steps": STEPS,
                                              "sampler": "ddim", "noise_level": 1.0, "classifier_free_guidance": guided,
                                              "guidance_scale": SCALE, **kw}))


def policy_sample(policy, prompt=PROMPT):
    """The policy's sample at noise 0: (final latents [C, T, M], the completion)."""
    policy.cfg.noise_level = 0.0
    rollout = policy.rollout([prompt], 1, seeds=[SEED])
    return rollout.extras["latents"][0, -1], rollout.completions[0]


@pytest.mark.parametrize("guided", [True, False])
def test_zero_noise_reproduces_the_stock_pipeline(guided):
    policy = make(guided)
    latents, completion = policy_sample(policy)
    stock = stock_call(policy.pipe, guided)
    assert latents.shape == (4, 32, 4) and torch.allclose(latents, stock[0].float(), atol=1e-5)
    wave = stock_call(policy.pipe, guided, "np")[0]
    assert completion["sampling_rate"] == 16000 and completion["array"].shape == wave.shape == (256,)
    assert np.abs(wave).max() > 1e-2 and np.abs(completion["array"] - wave).max() < 1e-6


def test_a_prompt_draws_alike_alone_and_beside_a_longer_one():
    """The stock call pads a batch's T5 states to its longest prompt and its GPT-2 reads the padding:
    the policy encodes each prompt alone, as the stock call with that prompt."""
    policy = make(True)
    policy.cfg.noise_level = 0.0
    batch = policy.rollout(["a dog", "rain falls on a tin roof"], 1, seeds=[SEED, SEED])
    alone = stock_call(policy.pipe, True, prompts=["a dog"])
    assert torch.allclose(batch.extras["latents"][0, -1], alone[0].float(), atol=1e-5)


def test_sampler_logprobs_are_the_training_forwards():
    policy = make(True)
    batch = policy.rollout([PROMPT, "a dog barks"], 2, seeds=[5, 6])
    assert torch.equal(batch.extras["latents"][0, 0], batch.extras["latents"][1, 0])
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    alone = policy.rollout(["a dog barks"], 2, seeds=[6])
    assert torch.allclose(alone.extras["latents"], batch.extras["latents"][2:], atol=1e-5)


def test_the_duration_sets_the_length_and_is_checked():
    policy = make(False, duration=0.03)  # 120 mel frames, 60 latent frames; 480 samples
    rollout = policy.rollout([PROMPT], 1, seeds=[1])
    assert rollout.extras["latents"].shape[-2:] == (60, 4) and rollout.completions[0]["array"].shape == (480,)
    assert stock_call(policy.pipe, False, "np", audio_length_in_s=0.03).shape == (1, 480)
    with pytest.raises(ValueError, match=r"policy.duration=0.0: AudioLDM2Pipeline draws a positive number"):
        make(False, duration=0.0)


# GRPO-Guard is refused: its step scales are the flow SDE steps' (as for SD 1.5)
METHODS = {"ddpo": [], "mix_grpo": FLOW_METHODS["mix_grpo"], "flow_grpo_fast": FLOW_METHODS["flow_grpo_fast"],
           "flow_dppo": FLOW_METHODS["flow_dppo"],
           "branch_grpo": ["policy.branching.at=[0]", "policy.branching.factor=3", "algorithm.group_size=3"]}


@pytest.mark.parametrize("method", list(METHODS))  # 1-3 s each on the loaded 2-core machine (2026-11-30)
def test_every_ddpm_method_takes_an_on_policy_step(method, tmp_path):
    assert on_policy_step_changes(Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", *METHODS[method]])))


def trained_lora(tmp_path):
    """A LoRA trained one step at a large rate: (its checkpoint, the policy's noise-0 latents and completion)."""
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", "optim.lora.r=4", "optim.lr=0.05"]))
    t.train()
    return latest_checkpoint(tmp_path), *policy_sample(t.policy)


def test_trained_lora_loads_in_the_stock_pipeline(tmp_path):
    checkpoint, ours, completion = trained_lora(tmp_path)
    pipe = TINY_MODELS.get("audioldm2")()  # the stock pipeline, as users build it
    base = stock_call(pipe, True)
    from peft import PeftModel  # diffusers has no LoRA loader for AudioLDM 2: PEFT's, on the stock UNet
    PeftModel.from_pretrained(pipe.unet, checkpoint / "model")  # injects the LoRA in place
    tuned = stock_call(pipe, True)
    assert torch.allclose(tuned[0].float(), ours, atol=1e-5)
    assert (tuned - base).abs().max() > 1e-3  # the LoRA changed the output
    assert np.abs(stock_call(pipe, True, "np")[0] - completion["array"]).max() < 1e-6


@pytest.mark.slow  # 15 s on the loaded 2-core machine (2026-11-30): a training step, the export, a pipeline reload
def test_merged_lora_export_is_a_stock_pipeline_directory(tmp_path):
    from diffusers import AudioLDM2Pipeline, DiffusionPipeline
    checkpoint, ours, _ = trained_lora(tmp_path)
    assert main(["export", str(checkpoint), "--merge", str(tmp_path / "merged")]) == 0
    merged = DiffusionPipeline.from_pretrained(tmp_path / "merged")
    assert type(merged) is AudioLDM2Pipeline and torch.allclose(stock_call(merged, True)[0].float(), ours, atol=1e-5)


def test_recipe_trains_two_steps_with_clap(tmp_path):
    """t2a_audioldm2.yaml as shipped, a tiny random CLAP registered as its judge."""
    from tiny_audio_judges import tiny_clap
    from mmrl.config.parse import load_recipe
    from mmrl.config.recipes import resolve_recipe
    from mmrl.rewards.audio_models import register_audio_model
    register_audio_model("clap", "tiny-clap", *tiny_clap())
    cfg = load_recipe(resolve_recipe("t2a_audioldm2"), [
        f"output_dir={tmp_path}", "rewards.clap.args.model=tiny-clap", "algorithm.group_size=2",
        "optim.prompts_per_step=1", "max_steps=2", "policy.num_steps=4", "logging.progress=false",
        "logging.report_to=[none]"])
    t = Trainer(cfg)
    assert all("lora_" in n for n, p in t.model.named_parameters() if p.requires_grad)
    for _ in range(2):
        metrics = t.train_step()
        assert metrics["ratio_max_dev"] == 0.0 and math.isfinite(metrics["loss"])
        assert -1.0 <= metrics["reward/clap"] <= 1.0


def test_plan_names_the_family_it_has_no_formula_for(capsys):
    assert main(["plan", "t2a_audioldm2", "--prompt-tokens", "8"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "AudioLDM2 (AudioLDM2Pipeline)" in err and "no memory formula" in err


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.ratio_norm=grpo_guard"], r"GRPO-Guard's step scales are those of the Gaussian SDE steps"),
    (["policy.sampler=cps"], r"policy.sampler='cps' does not fit"),
    (["policy.units=forward_process", "policy.classifier_free_guidance=false", "algorithm.objective=nft"],
     r"predicts eps")])
def test_the_flow_only_methods_are_refused_by_name(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", *overrides]))


def test_a_bare_gpt2_language_model_is_wrapped_as_the_pipeline_declares_it():
    """cvssp/audioldm2 saves its language model as GPT2Model, which the stock call cannot run on
    transformers 5 (diffusers issue #12630): the family wraps it around the same weights."""
    from transformers import GPT2Model

    from mmrl.tasks.diffusion.audioldm2 import AudioLDM2
    pipe = TINY_MODELS.get("audioldm2")()
    reference = stock_call(pipe, True)
    bare = GPT2Model(pipe.language_model.config).eval()
    bare.load_state_dict(pipe.language_model.transformer.state_dict())
    pipe.language_model = bare
    with pytest.raises(AttributeError, match="GPT2Model"):
        stock_call(pipe, True)
    AudioLDM2(pipe, (0, 0))
    assert pipe.language_model.transformer is bare and torch.equal(stock_call(pipe, True), reference)
