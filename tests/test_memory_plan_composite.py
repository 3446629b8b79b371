"""`mmrl plan` for the composite policy (tasks/composite/memory_formula.py): its parts' formulas
joined as the composite runs them, checked against the allocation probe (scripts/memory_probe.py) on
a thinker and a Janus generator, the state of a frozen part and a part's LoRA, and a part without a
formula refused by name."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from test_memory_plan import measured_peak

from mmrl.cli.main import main
from mmrl.config.parse import from_dict, parse_config
from mmrl.experiments.memory_plan import plan_memory
from mmrl.registry import ADAPTERS


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))


def composite_recipe(hidden, codebook, patches, tokens, group=2):
    """bench_memory_plan's step for the composite: the tiny Qwen2 thinks `tokens` characters, the tiny
    Janus draws `patches`^2 image tokens from them; 2 prompts x `group`."""
    from bench_memory_plan import PROMPTS, recipe
    args = argparse.Namespace(task="composite", vocab=codebook, patches=patches, layers=2, group=group,
                              checkpointing=False)
    return recipe(hidden, tokens, args), len(PROMPTS[0])


@pytest.mark.slow  # 17-21 s under the profiler on the loaded 2-core machine (2026-11-30)
def test_the_composite_plan_predicts_the_probed_step(scripts):
    """The first row of docs/benchmarks.md's composite table (a thinker of 32 tokens, then Janus:
    hidden 64, a 16,384-token codebook, 64 image tokens): the plan's peak (the generator's update)
    within 15% of the probe's."""
    recipe, prompt = composite_recipe(64, 16384, 8, 32)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=prompt)
    assert all(name.startswith("generator: ") for name in plan.update)
    assert plan.peak == pytest.approx(measured_peak(recipe), rel=0.15)


def test_a_frozen_part_and_a_parts_lora_train_what_the_policy_trains(scripts):
    """The plan's trained parameters against the built policy's, with the generator frozen and with
    the thinker's own LoRA."""
    recipe, prompt = composite_recipe(64, 1024, 4, 8)
    for settings in ({"freeze": "generator"}, {"thinker_lora": {"r": 4}}):
        cfg = parse_config({**recipe, "policy": {**recipe["policy"], **settings}})
        policy = ADAPTERS.get("composite")(from_dict(ADAPTERS.get("composite").Config, cfg.policy, "policy"))
        plan = plan_memory(cfg, 1, prompt_length=prompt)
        assert plan.trainable == sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
        assert plan.parameters == sum(p.numel() for p in policy.model.parameters())


def test_a_part_not_checked_inside_a_composite_is_named(capsys):
    assert main(["plan", "think_draw", "--prompt-tokens", "16"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "generator of task diffusion has no memory formula checked" in err
