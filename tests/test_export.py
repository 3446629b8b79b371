"""Outputs load where users load them: a diffusion LoRA checkpoint applies to the stock diffusers
pipeline through `load_lora_weights`, a full diffusion fine-tune is a whole pipeline directory for
`DiffusionPipeline.from_pretrained`, an LM / VLM LoRA loads with `PeftModel.from_pretrained` and
`mmrl export CHECKPOINT --merge OUT` writes a plain `from_pretrained` directory."""

import numpy as np
import pytest
import torch
from helpers import TINY_RECIPE
from mmrl.tasks.model_loading import TINY_MODELS
from PIL import Image
from test_diffusion import RECIPE as DIFFUSION_RECIPE
from test_diffusion import SIZE
from test_diffusion import make as make_diffusion
from test_vlm import RECIPE as VLM_RECIPE

from mmrl.cli.main import main
from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.train.safety.checkpoint import latest_checkpoint

PROMPT, SEED, STEPS = "red circle", 7, 4


def train(recipe, tmp_path, *overrides):
    t = Trainer(parse_config(recipe, [f"output_dir={tmp_path}", *overrides]))
    t.train()
    return t, latest_checkpoint(tmp_path)


def stock_sample(pipe, output_type="latent"):
    """The stock pipeline's sample with the policy's evaluation settings."""
    return pipe([PROMPT], num_inference_steps=STEPS, height=SIZE, width=SIZE, guidance_scale=4.5,
                generator=torch.Generator().manual_seed(SEED), output_type=output_type).images


def policy_sample(policy):
    """The trained policy's sample at noise 0 (every step deterministic): (final latents, image)."""
    policy.cfg.noise_level = 0.0
    rollout = policy.rollout([PROMPT], 1, seeds=[SEED])
    return rollout.extras["latents"][0, -1], np.asarray(rollout.completions[0], dtype=np.int16)


def test_diffusion_lora_loads_into_the_stock_pipeline(tmp_path):
    t, checkpoint = train(DIFFUSION_RECIPE, tmp_path, "optim.lora.r=4", "optim.lr=0.05")
    ours, image = policy_sample(t.policy)
    pipe = TINY_MODELS.get("sd3")()  # the stock pipeline, as users build it
    base = stock_sample(pipe)
    pipe.load_lora_weights(checkpoint / "model")
    tuned = stock_sample(pipe)
    assert torch.allclose(tuned[0].float(), ours, atol=1e-5)
    assert (tuned - base).abs().max() > 1e-3  # the LoRA changed the output, and the loaded pipeline shows it
    assert np.abs(np.asarray(stock_sample(pipe, "pil")[0], dtype=np.int16) - image).max() <= 1
    # merged into the base: a whole pipeline directory with the same output
    from diffusers import DiffusionPipeline
    assert main(["export", str(checkpoint), "--merge", str(tmp_path / "merged")]) == 0
    merged = DiffusionPipeline.from_pretrained(tmp_path / "merged")
    assert torch.allclose(stock_sample(merged)[0].float(), ours, atol=1e-5)


@pytest.mark.parametrize("name", ["flux", "sd15"])
def test_diffusers_lora_format_of_the_other_families(name, tmp_path):
    """FLUX (packed latents) and SD 1.5 (a UNet: `unet_lora_layers`) through the same hook, with a
    LoRA of random weights instead of a trained one."""
    from peft import LoraConfig, get_peft_model
    policy = make_diffusion(name, eval_num_steps=STEPS)
    policy.model = get_peft_model(policy.model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    policy.save_pretrained(policy.model, tmp_path)
    ours, _ = policy_sample(policy)
    pipe = TINY_MODELS.get(name)()
    base = stock_sample(pipe)
    pipe.load_lora_weights(tmp_path)
    tuned = stock_sample(pipe)
    assert torch.allclose(tuned[0].float(), ours, atol=1e-5)
    assert (tuned - base).abs().max() > 1e-3


def test_full_diffusion_fine_tune_is_a_pipeline_directory(tmp_path):
    from diffusers import DiffusionPipeline
    t, checkpoint = train(DIFFUSION_RECIPE, tmp_path, "optim.lr=0.01")
    ours, _ = policy_sample(t.policy)
    pipe = DiffusionPipeline.from_pretrained(checkpoint / "model")
    assert type(pipe) is type(t.policy.pipe)
    for (name, p), (_, q) in zip(pipe.transformer.named_parameters(), t.unwrapped.named_parameters()):
        assert torch.equal(p, q), name
    assert not all(torch.equal(p, q) for p, q in zip(TINY_MODELS.get("sd3")().transformer.parameters(),
                                                      pipe.transformer.parameters()))
    assert torch.allclose(stock_sample(pipe)[0].float(), ours, atol=1e-5)


def lm_inputs(policy):
    return policy._model_inputs(policy._encode_prompts(["12+34="]))


def vlm_inputs(policy):
    rng = np.random.default_rng(0)
    row = {"prompt": "what shape?", "image": Image.fromarray(rng.integers(0, 255, (56, 56, 3), dtype=np.uint8))}
    return policy._model_inputs(policy._encode_prompts([row]))


CASES = {"causal_lm": (TINY_RECIPE, "AutoModelForCausalLM", "AutoTokenizer", lm_inputs),
         "vlm": ({**VLM_RECIPE, "reward_modules": TINY_RECIPE["reward_modules"]}, "AutoModelForImageTextToText",
                 "AutoProcessor", vlm_inputs)}


@pytest.mark.parametrize("task", list(CASES))
def test_lora_loads_with_peft_and_merges_into_a_plain_directory(task, tmp_path):
    import transformers
    from peft import PeftModel
    recipe, model_class, processor_class, inputs_of = CASES[task]
    t, checkpoint = train(recipe, tmp_path / "run", "optim.lora.r=4", "optim.lr=0.05", "max_steps=1")
    inputs = inputs_of(t.policy)
    with torch.no_grad():
        trained = t.unwrapped(**inputs).logits
        fresh = type(t.policy)(t.policy.cfg)  # the base model as the recipe names it
        base = fresh.model(**inputs).logits
        loaded = PeftModel.from_pretrained(fresh.model, checkpoint / "model")(**inputs).logits
    assert torch.allclose(loaded, trained, atol=1e-5)
    assert (trained - base).abs().max() > 1e-4  # the adapter changes the model

    out = tmp_path / "merged"
    assert main(["export", str(checkpoint), "--merge", str(out)]) == 0
    merged = getattr(transformers, model_class).from_pretrained(out)
    getattr(transformers, processor_class).from_pretrained(out)
    assert not (out / "adapter_config.json").exists()
    with torch.no_grad():
        assert torch.allclose(merged(**inputs).logits, trained, atol=1e-5)
    assert main(["export", str(checkpoint), "--merge", str(out)]) == 2  # never writes over a directory


def test_export_errors_name_the_problem(tmp_path, capsys):
    _, checkpoint = train(TINY_RECIPE, tmp_path / "run")  # a full fine-tune: nothing to merge
    assert main(["export", str(checkpoint), "--merge", str(tmp_path / "out")]) == 2
    assert "holds full weights, not a LoRA adapter" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nowhere"), "--merge", str(tmp_path / "out")]) == 2
    assert "nowhere/model: not found" in capsys.readouterr().err
