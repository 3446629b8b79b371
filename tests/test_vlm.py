"""The vision-language adapter on a tiny random Qwen2.5-VL: batch-size invariance with images of
different sizes, exact on-policy log-probs, streaming, a training step, broken image files."""

import numpy as np
import pytest
import torch
from helpers import assert_grads_close, on_policy_step_changes, streamed_grads
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy
from PIL import Image

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer

RNG = np.random.default_rng(0)


def image(h, w):
    return Image.fromarray(RNG.integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def policy():
    return VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", max_new_tokens=6))


ROWS = [{"prompt": "where is it?", "image": image(56, 84)},
        {"prompt": "red?", "image": image(112, 56)},
        {"prompt": "two images", "image": [image(56, 56), image(28, 56)]}]


def test_each_row_equals_the_row_alone(policy):
    batch = policy.rollout(ROWS, 2, seeds=[1, 2, 3])
    full, _ = policy.logprobs(policy.model, batch)
    for g, row in enumerate(ROWS):
        alone = policy.rollout([row], 2, seeds=[g + 1])
        assert alone.completions == batch.completions[2 * g:2 * g + 2]
        single, _ = policy.logprobs(policy.model, alone)
        width = single.shape[1]
        assert torch.allclose(full[2 * g:2 * g + 2, :width], single, atol=1e-5)


def test_on_policy_ratio_is_exactly_one(policy):
    batch = policy.rollout(ROWS[:2], 2, seeds=[5, 6])
    with torch.no_grad():
        old, _ = policy.logprobs(policy.model, batch)
    new, _ = policy.logprobs(policy.model, batch)
    assert torch.equal(old, new)


def test_broken_image_file_is_named(policy, tmp_path):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(ValueError, match="broken.png"):
        policy.rollout([{"prompt": "x", "image": str(bad)}], 1, seeds=[0])
    with pytest.raises(ValueError, match="missing.png"):
        policy.rollout([{"prompt": "x", "image": str(tmp_path / "missing.png")}], 1, seeds=[0])


RECIPE = {
    "task": "vlm",
    "policy": {"model": "tiny:qwen2.5-vl-char", "max_new_tokens": 6},
    "data": {"name": "shapes", "args": {"n_train": 16, "n_eval": 4, "size": 56}},
    "rewards": {"digit_share": {"weight": 1.0}},
    "algorithm": {"group_size": 3},
    "optim": {"lr": 1e-2, "prompts_per_step": 3, "micro_batch_size": 9},
    "logging": {"report_to": ["none"], "progress": False},
    "max_steps": 1,
}


def test_streaming_and_a_training_step(tmp_path):
    from pathlib import Path
    recipe = dict(RECIPE, reward_modules=[str(Path(__file__).parent / "digit_reward.py")])
    t = Trainer(parse_config(recipe, [f"output_dir={tmp_path}"]))
    batch = t.prepare_batch(1)
    assert_grads_close(*streamed_grads(t, batch, (9, 2)))
    changed = on_policy_step_changes(t)
    assert any("visual" in n for n in changed) and any("language_model" in n for n in changed)


def test_grounding_demo_writes_summary_and_box_figure(tmp_path):
    import json
    import os
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "mmrl", "demo", "grounding", f"output_dir={tmp_path}",
                           "warm_start.steps=2", "max_steps=1", "eval.max_prompts=4", "eval.group_size=2",
                           "data.args.n_train=8", "logging.progress=false"],
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {"before", "after", "greedy_before", "greedy_after"} <= set(summary)
    assert (tmp_path / "plots" / "samples.png").read_bytes()[:4] == b"\x89PNG"


def test_supervised_loss_is_the_whole_vocabulary_nll(policy):
    """The warm start is plain supervised fine-tuning: its NLL normalises over every token, the
    placeholder tokens the sampler bans included (they are banned in rollout / training log-probs)."""
    assert policy.suppressed_tokens()
    rows = [{"prompt": "what?", "image": image(56, 56), "target": "ab"}]
    loss = policy.supervised_loss(policy.model, rows, "target")
    target = policy.tokenizer("ab", add_special_tokens=False)["input_ids"] + [policy.tokenizer.eos_token_id]
    ids = torch.tensor([target])
    mask = torch.ones(1, len(target))
    with torch.no_grad():
        whole, _ = policy._token_logprobs(policy.model, policy._encode_prompts(rows), ids, mask, 1.0, False,
                                          as_sampled=False)
        banned, _ = policy._token_logprobs(policy.model, policy._encode_prompts(rows), ids, mask, 1.0, False)
    assert torch.allclose(loss, -whole.mean(), atol=1e-6)
    assert (banned > whole).all()  # the bans renormalise over fewer tokens: a different quantity
