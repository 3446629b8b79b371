"""The think-draw demo's parts: the riddles data set (shape_riddles), the composite's supervised warm
start (each trained part's own loss on its own target, tasks/composite/warm_start.py), and the demo
end to end (slow)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from test_composite import THINKER, trainer

from mmrl.errors import UserError
from mmrl.tasks.demos.synthetic.colour_shapes import COLOURS, SHAPES
from mmrl.tasks.demos.synthetic.shape_riddles import shape_riddles

GENERATOR = {"model": "tiny:pixel-flow-unet", "tiny_args": {"channels": [8, 16], "head_dim": 8, "size": 16},
             "height": 16, "width": 16, "num_steps": 3, "eval_num_steps": 3, "noise_level": 0.7}


def riddles_recipe(**policy) -> dict:
    return {"task": "composite", "policy": {"thinker": THINKER, "generator": GENERATOR, **policy},
            "data": {"name": "shape_riddles", "args": {"n_train": 8, "n_eval": 8, "size": 16}},
            "rewards": {"colour_shape": {"weight": 1.0}}, "reward_modules": [],
            "algorithm": {"group_size": 2, "eps_low": 1e-3, "eps_high": 1e-3},
            "optim": {"lr": 1e-3, "prompts_per_step": 2},
            "warm_start": {"steps": 1, "batch_size": 4, "target_column": "image"}}


def test_held_out_riddles_are_phrasings_training_never_shows():
    data = shape_riddles(n_train=400, n_eval=16, seed=3)
    seen = {r["prompt"] for r in data["train"]}
    held = {r["prompt"] for r in data["eval"]}
    assert not seen & held
    assert {(r["colour"], r["shape"]) for r in data["eval"]} == {(c, s) for c in COLOURS for s in SHAPES}
    assert len(seen) == 3 * len(COLOURS) * len(SHAPES)  # the 3 other phrasings of every pair
    for row in data["train"] + data["eval"]:
        assert row["rewrite"] == f"{row['colour']} {row['shape']}"
        words = row["prompt"].replace(",", " ").split()
        assert row["colour"] not in words and row["shape"] not in words
    for word in ("grass", "lemon", "no corners", "four corners"):  # every phrase is seen in training
        assert any(word in p for p in seen)


@pytest.mark.parametrize("frozen", ["none", "thinker", "generator"])
def test_the_warm_start_is_each_trained_parts_own_loss(tmp_path, frozen):
    """The composite's loss is the thinker's on (riddle -> rewrite) plus the generator's on (rewrite ->
    drawing), each computed by its own adapter on rows built here; a frozen part adds nothing."""
    t = trainer(tmp_path, riddles_recipe(freeze=frozen, prompt_template="a {thought}"))
    thinker, generator = t.policy.parts["thinker"], t.policy.parts["generator"]
    rows = t.inputs.train_rows[:3]
    torch.manual_seed(0)
    whole = t.policy.supervised_loss(t.unwrapped, rows, "image")
    own_thinker = thinker.supervised_loss(thinker.model, [{"prompt": r["prompt"], "out": r["rewrite"]} for r in rows],
                                          "out")
    torch.manual_seed(0)
    own_generator = generator.supervised_loss(
        generator.model, [{"prompt": f"a {r['rewrite']}", "pic": r["image"]} for r in rows], "pic")
    expected = {"none": own_thinker + own_generator, "thinker": own_generator, "generator": own_thinker}[frozen]
    assert torch.allclose(whole, expected, atol=1e-6)


def test_a_row_without_the_thought_column_is_named(tmp_path):
    t = trainer(tmp_path, riddles_recipe(thought_column="plain"))
    with pytest.raises(UserError, match=r"row 0 has no policy\.thought_column='plain'"):
        t.policy.supervised_loss(t.unwrapped, t.inputs.train_rows[:2], "image")


def test_the_warm_start_trains_both_parts(tmp_path):
    t = trainer(tmp_path, riddles_recipe())
    before = {n: p.detach().clone() for n, p in t.unwrapped.named_parameters()}
    t.warm_start()
    moved = {n.split(".")[1] for n, p in t.unwrapped.named_parameters() if not torch.equal(before[n], p)}
    assert moved == {"thinker", "generator"}


# 1,550 s measured 2026-11-30 (the recipe as shipped, seed 0, three runs at once at load 8-9): the held-out
# reward 0.662 -> 0.696 (+2.6 SE). The judge fell within its noise (0.562 -> 0.523, SE 0.072), so it is
# not asserted: docs/results/think_draw/README.md says why.
@pytest.mark.slow
def test_think_draw_demo_raises_the_held_out_reward(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "mmrl", "demo", "think-draw", f"output_dir={tmp_path}",
                           "logging.progress=false"], env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["after"] - summary["before"] > 2 * max(summary["before_se"], summary["after_se"])
    assert {"eval_before", "eval_after"} <= set(summary)
    assert (tmp_path / "plots" / "samples.png").read_bytes()[:4] == b"\x89PNG"
    thoughts = json.loads((tmp_path / "samples" / "after" / "samples.json").read_text())
    assert all(isinstance(s["greedy_columns"]["thought"][0], str) for s in thoughts)
