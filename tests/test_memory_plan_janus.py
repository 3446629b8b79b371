"""`mmrl plan` for Janus text-to-image (tasks/ar_image/memory_formula.py): the trained parameters
against the policy's, the prompt's tokens against its encoding, the VQ decode against the allocation
probe (scripts/memory_probe.py), and the whole step against the probe."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from test_memory_plan import measured_peak

from mmrl.config.parse import from_dict, parse_config
from mmrl.experiments.memory_plan import plan_memory
from mmrl.registry import ADAPTERS


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))


def janus_recipe(hidden, codebook, patches, group=2, layers=2):
    """bench_memory_plan's step for the janus adapter: 2 prompts x `group` images of `patches`^2 tokens."""
    from bench_memory_plan import JANUS_PROMPT_TOKENS, recipe
    args = argparse.Namespace(task="janus", vocab=codebook, patches=patches, layers=layers, group=group,
                              checkpointing=False)
    return recipe(hidden, 0, args), JANUS_PROMPT_TOKENS


def test_the_trained_parameters_and_the_prompt_are_the_policys(scripts):
    """The plan trains what the policy leaves trainable (not the VQ model or the understanding
    encoder) and counts the prompt as the policy encodes it (the template and the begin-of-image token)."""
    from bench_memory_plan import PROMPTS
    recipe, prompt = janus_recipe(64, 1024, 8)
    cfg = parse_config(recipe)
    policy = ADAPTERS.get("janus")(from_dict(ADAPTERS.get("janus").Config, cfg.policy, "policy"))
    plan = plan_memory(cfg, 1, prompt_length=prompt)
    assert plan.trainable == sum(p.numel() for p in policy.model.parameters() if p.requires_grad) < plan.parameters
    assert plan.state["optimizer state"] == 8 * plan.trainable
    assert policy.encode(PROMPTS)[0].shape[1] == prompt


@pytest.mark.parametrize("patches,rows", [(8, 4), (32, 1)])
def test_the_vq_decode_is_the_probes(scripts, patches, rows):
    """The decode of `rows` images (32 and 128 pixels a side: the last stage's maps, then the middle
    block's attention, the larger) within 5% of the probe's peak of the model's own decode."""
    from memory_probe import peak_bytes

    from mmrl.tasks.model_loading import load_tiny
    recipe, prompt = janus_recipe(32, 64, patches, layers=1)
    cfg = parse_config(recipe)
    adapter = ADAPTERS.get("janus")
    formula = adapter.memory_model(from_dict(adapter.Config, cfg.policy, "policy"), prompt)
    planned = formula.rollout_bytes(rows, rows)["VQ decode of the images"]
    model, _ = load_tiny("tiny:janus", recipe["policy"]["tiny_args"], "float32")
    tokens = torch.randint(0, 64, (rows, patches * patches))
    with torch.no_grad():
        measured = peak_bytes(lambda: model.decode_image_tokens(tokens))
    assert planned == pytest.approx(measured, rel=0.05)


def test_the_janus_plan_predicts_the_probed_step(scripts):
    """The tiny Janus (hidden 64, a 16,384-token codebook, 64 image tokens), 2 prompts x 2 images:
    the plan's peak within 15% of the probe's."""
    recipe, prompt = janus_recipe(64, 16384, 8)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=prompt)
    assert plan.peak == pytest.approx(measured_peak(recipe), rel=0.15)


@pytest.mark.slow  # 12-15 s each under the profiler on the loaded 2-core machine (2026-11-30)
@pytest.mark.parametrize("hidden,codebook,patches,group", [(64, 16384, 16, 2), (128, 8192, 12, 4)])
def test_the_janus_plan_at_other_sizes(scripts, hidden, codebook, patches, group):
    """256 image tokens, and a wider decoder with 4 images per prompt: within 15%."""
    recipe, prompt = janus_recipe(hidden, codebook, patches, group)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=prompt)
    assert plan.peak == pytest.approx(measured_peak(recipe), rel=0.15)
