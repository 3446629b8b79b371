"""Prefix sharing: the shared-prefix forward gives the plain forward's log-probs and gradients
(text, image, video and audio models; completions of different lengths; micro-batches holding parts of
groups), streaming and the on-policy ratio stay exact, `auto` and the fallback choose the path."""

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TINY_RECIPE, assert_grads_close, streamed_grads, tiny_overrides
from mmrl.tasks.demos.tiny_models import seeded_model
from mmrl.tasks.lm.audio_lm import AudioLMConfig, AudioLMPolicy
from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy
from mmrl.tasks.lm.prefix_sharing import SharedLayout, prompt_groups, unsupported_reason, worth_sharing
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy
from PIL import Image
from transformers import Gemma3Config, Qwen2Config, Qwen2ForCausalLM

from mmrl.config.parse import ConfigError, parse_config
from mmrl.train.loop.parts import build_policy
from mmrl.train.loop.trainer import Trainer
from mmrl.train.plan.validate import validate

RNG = np.random.default_rng(0)
TOL = 1e-5


def image(h, w):
    return Image.fromarray(RNG.integers(0, 255, (h, w, 3), dtype=np.uint8))


def clip(n, rate):
    return {"array": RNG.standard_normal(n) * 0.1, "sampling_rate": rate}


def test_layout_masks_positions_and_gather_by_hand():
    # one prompt [pad, a, b]; completions [4, 5] and [6, 9] (width 3)
    layout = SharedLayout.build(torch.tensor([[0, 7, 8]]), torch.tensor([[0, 1, 1]]),
                                torch.tensor([[4, 5, 0], [6, 9, 0]]), torch.tensor([2, 2]), [[0, 1]], pad_id=0)
    assert layout.input_ids.tolist() == [[0, 7, 8, 4, 5, 6, 9]]
    assert layout.segment.tolist() == [[-1, -1, -1, 0, 0, 1, 1]]
    expected = [[1, 0, 0, 0, 0, 0, 0],   # a padding query sees only itself
                [0, 1, 0, 0, 0, 0, 0],
                [0, 1, 1, 0, 0, 0, 0],
                [0, 1, 1, 1, 0, 0, 0],   # completion 0: the prompt and itself, causally
                [0, 1, 1, 1, 1, 0, 0],
                [0, 1, 1, 0, 0, 1, 0],   # completion 1 does not see completion 0
                [0, 1, 1, 0, 0, 1, 1]]
    config = Qwen2Config()
    config._attn_implementation = "sdpa"
    assert layout.attention_mask(config, torch.float32, torch.device("cpu"))[0, 0].int().tolist() == expected
    config._attn_implementation = "eager"
    additive = layout.attention_mask(config, torch.float32, torch.device("cpu"))[0, 0]
    assert (additive == 0).int().tolist() == expected
    # region tokens [4, 5, 6, 9] predict [5, 6, 9, pad]; unit 1 of row 0 is read at region column 0,
    # unit 1 of row 1 at column 2; units 0 come from the prompt's last logit
    assert layout.next_ids().tolist() == [[5, 6, 9, 0]]
    assert layout.gather[:, 1].tolist() == [0, 2] and layout.row_group.tolist() == [0, 0]
    # both completions continue from the position after the prompt
    assert layout.positions(torch.tensor([[0, 0, 1, 2]])).tolist() == [[0, 0, 1, 2, 3, 2, 3]]


def test_rows_are_grouped_by_group_and_prompt():
    ids = torch.tensor([[1, 2], [1, 2], [3, 4], [1, 2], [3, 4], [1, 9]])
    assert prompt_groups(torch.tensor([3, 3, 5, 3, 5, 3]), ids) == [[0, 1, 3], [2, 4], [5]]
    auxiliary = torch.tensor([False, True, False, True, False, False])  # T-GRPO's shuffled-frame rows
    assert prompt_groups(torch.tensor([3, 3, 5, 3, 5, 3]), ids, auxiliary) == [[0], [1, 3], [2, 4], [5]]


def with_lengths(policy, rollout, lengths):
    """The rollout with completions cut to `lengths` units (0: fully masked)."""
    mask = (torch.arange(rollout.num_units)[None, :] < torch.tensor(lengths)[:, None]).float()
    rollout.unit_mask = mask
    rollout.extras["completion_ids"] = rollout.extras["completion_ids"].masked_fill(mask == 0,
                                                                                    policy.tokenizer.pad_token_id)
    return rollout


def logprobs_and_grads(policy, batch, mode):
    policy.cfg.prefix_sharing = mode
    weights = torch.linspace(-1, 1, batch.unit_mask.numel()).view_as(batch.unit_mask)
    logp, ent = policy.logprobs(policy.model, batch, with_entropy=True)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    grads = torch.autograd.grad((logp * weights).sum(), params, allow_unused=True)
    return logp, ent * batch.unit_mask, grads


def assert_equal_to_plain(policy, batch, selections):
    shared_calls = []
    original = policy._shared_token_logprobs
    policy._shared_token_logprobs = lambda *a, **k: shared_calls.append(1) or original(*a, **k)
    try:
        for rows in selections:
            mb = batch.select(rows)
            shared = logprobs_and_grads(policy, mb, "on")
            plain = logprobs_and_grads(policy, mb, "off")
            assert (shared[0] - plain[0]).abs().max() <= TOL
            assert (shared[1] - plain[1]).abs().max() <= TOL
            for gs, gp in zip(shared[2], plain[2]):
                assert (gs is None) == (gp is None)
                if gs is not None:
                    assert (gs - gp).abs().max() <= TOL
            assert plain[2][0].abs().max() > 0
        policy.cfg.prefix_sharing = "on"
        with torch.no_grad():
            old, _ = policy.logprobs(policy.model, batch)
        new, _ = policy.logprobs(policy.model, batch)
        assert torch.equal(old, new)  # the on-policy ratio is exactly 1
    finally:
        del policy._shared_token_logprobs
    assert len(shared_calls) == len(selections) + 2  # the shared path ran


SELECTIONS = [list(range(9)), [1, 2, 3, 4], [8, 0, 4, 5], [6]]  # whole groups, parts of groups, mixed order
LENGTHS = [8, 3, 5, 1, 0, 6, 8, 2, 4]


def text_policy(**cfg):
    return CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=8, **cfg))


@pytest.mark.parametrize("attention,sliding", [("sdpa", False), ("eager", False), ("sdpa", True)])
def test_text_logprobs_and_gradients_equal_the_plain_forward(attention, sliding):
    policy = text_policy()
    config = Qwen2Config(**{**policy.model.config.to_dict(), "layer_types": None, "use_sliding_window": sliding,
                            "sliding_window": 6, "max_window_layers": 1})
    config._attn_implementation = attention
    policy.model = seeded_model(Qwen2ForCausalLM, config, policy.tokenizer, 0)
    batch = policy.rollout(["12+34=", "5+6=", "a longer prompt: 7*8="], 3, seeds=[1, 2, 3])
    assert_equal_to_plain(policy, with_lengths(policy, batch, LENGTHS), SELECTIONS)


def test_image_logprobs_and_gradients_equal_the_plain_forward():
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", max_new_tokens=8))
    rows = [{"prompt": "where is it?", "image": image(56, 84)}, {"prompt": "red?", "image": image(112, 56)},
            {"prompt": "two images", "image": [image(56, 56), image(28, 56)]}]
    batch = policy.rollout(rows, 3, seeds=[1, 2, 3])
    assert_equal_to_plain(policy, with_lengths(policy, batch, LENGTHS), SELECTIONS)


def test_video_logprobs_and_gradients_equal_the_plain_forward():
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", max_new_tokens=8))  # videos: tasks/lm/video_clips.py
    rows = [{"prompt": "what moves?", "video": RNG.integers(0, 255, (4, 28, 56, 3), dtype=np.uint8)},
            {"prompt": "count", "video": RNG.integers(0, 255, (4, 56, 28, 3), dtype=np.uint8)},
            {"prompt": "where?", "video": RNG.integers(0, 255, (2, 28, 28, 3), dtype=np.uint8)}]
    batch = policy.rollout(rows, 3, seeds=[1, 2, 3])
    assert "video_grid_thw" in batch.extras
    assert_equal_to_plain(policy, with_lengths(policy, batch, LENGTHS), SELECTIONS)


def test_audio_logprobs_and_gradients_equal_the_plain_forward():
    policy = AudioLMPolicy(AudioLMConfig(model="tiny:qwen2-audio-char", max_new_tokens=8))
    rows = [{"prompt": "what?", "audio": clip(8000, 8000)}, {"prompt": "who speaks?", "audio": clip(24000, 16000)},
            {"prompt": "say", "audio": clip(12000, 16000)}]
    batch = policy.rollout(rows, 3, seeds=[1, 2, 3])
    assert_equal_to_plain(policy, with_lengths(policy, batch, LENGTHS), SELECTIONS)


def test_auto_shares_long_prompts_only():
    policy = text_policy()
    short = policy.rollout(["1+1="], 4, seeds=[0])
    long = policy.rollout(["1+1=" * 40], 4, seeds=[0])
    assert policy._shared_prefix_groups(short, short.unit_mask) is None
    assert policy._shared_prefix_groups(long, long.unit_mask) == [[0, 1, 2, 3]]
    # 4 rows, 64-token prompt, completions of 8: plain 4 x 72 tokens, shared 64 + 32 = 96
    assert worth_sharing(torch.ones(4, 64), torch.full((4,), 8), [[0, 1, 2, 3]])
    assert not worth_sharing(torch.ones(4, 64), torch.full((4,), 8), [[0, 1], [2], [3]])


def test_switch_is_validated_and_reads_yaml_booleans(tmp_path):
    cfg = parse_config(TINY_RECIPE, tiny_overrides(tmp_path, **{"policy.prefix_sharing": "on"}))
    assert build_policy(cfg).cfg.prefix_sharing == "on"  # YAML reads `on` as true
    cfg = parse_config(TINY_RECIPE, tiny_overrides(tmp_path, **{"policy.prefix_sharing": "always"}))
    with pytest.raises(ValueError, match="policy.prefix_sharing"):
        build_policy(cfg)
    with pytest.raises(ValueError, match="policy.prefix_sharing"):
        text_policy(prefix_sharing="always")


def test_unsupported_attention_falls_back_and_says_so_once(caplog):
    policy = text_policy(prefix_sharing="auto")
    batch = policy.rollout(["1+1=" * 40], 2, seeds=[0])
    policy.model.config._attn_implementation = "flex_attention"
    with caplog.at_level(logging.WARNING, logger="tasks.lm.scoring"):
        assert policy._shared_prefix_groups(batch, batch.unit_mask) is None
        assert policy._shared_prefix_groups(batch, batch.unit_mask) is None
    assert len([r for r in caplog.records if "plain forward" in r.getMessage()]) == 1
    policy.model.config._attn_implementation = "sdpa"
    assert unsupported_reason(policy.model.config) is None
    assert "bidirectionally" in unsupported_reason(Gemma3Config())


def test_tiny_models_take_the_attention_implementation():
    sdpa, eager = text_policy(), text_policy(attn_implementation="eager")
    assert (sdpa.model.config._attn_implementation, eager.model.config._attn_implementation) == ("sdpa", "eager")
    ids = sdpa.tokenizer(["12+34="], return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.allclose(sdpa.model(ids).logits, eager.model(ids).logits, atol=1e-5)  # same weights


def test_sharing_on_with_an_attention_that_takes_no_4d_mask_is_refused_before_the_model_loads(tmp_path):
    cfg = parse_config(TINY_RECIPE, tiny_overrides(tmp_path, **{"policy.prefix_sharing": "on",
                                                                "policy.attn_implementation": "flex_attention"}))
    with pytest.raises(ConfigError, match=r"policy.prefix_sharing=on .*policy.attn_implementation='flex_attention'"):
        validate(cfg, 1)
    with pytest.raises(ValueError, match=r"policy.prefix_sharing=on .*'flex_attention'"):
        text_policy(prefix_sharing="on", attn_implementation="flex_attention")
    cfg = parse_config(TINY_RECIPE, tiny_overrides(tmp_path, **{"policy.prefix_sharing": "auto",
                                                                "policy.attn_implementation": "flex_attention"}))
    validate(cfg, 1)  # auto falls back to the plain forward


def test_sharing_on_with_a_model_that_cannot_share_is_refused_when_it_loads():
    with pytest.raises(ValueError, match="policy.prefix_sharing=on: the model's attention is not causal"):
        CausalLMPolicy(CausalLMConfig(model="tiny:dlm-char", prefix_sharing="on", max_new_tokens=4))  # bidirectional


def test_text_training_streams_exactly_and_starts_on_policy(tmp_path):
    overrides = tiny_overrides(tmp_path, **{"policy.prefix_sharing": "on", "algorithm.mu": 2})
    t = Trainer(parse_config(TINY_RECIPE, overrides))
    batch = t.prepare_batch(1)
    one, streamed = streamed_grads(t, batch, (16, 3))  # 3 rows a micro-batch: groups of 4 split
    assert_grads_close(one, streamed)
    t.policy.cfg.prefix_sharing = "off"
    plain, = streamed_grads(t, batch, (16,))
    assert_grads_close(one, plain)
    t.policy.cfg.prefix_sharing = "on"
    metrics = t.train_step()
    assert metrics["ratio_max_dev"] == 0.0


def test_image_training_streams_exactly_and_starts_on_policy(tmp_path):
    recipe = {"task": "vlm", "policy": {"model": "tiny:qwen2.5-vl-char", "max_new_tokens": 6, "prefix_sharing": "on"},
              "data": {"name": "shapes", "args": {"n_train": 16, "n_eval": 4, "size": 56}},
              "rewards": {"digit_share": {"weight": 1.0}},
              "reward_modules": [str(Path(__file__).parent / "digit_reward.py")],
              "algorithm": {"group_size": 3, "mu": 2}, "optim": {"lr": 1e-2, "prompts_per_step": 3},
              "logging": {"report_to": ["none"], "progress": False}, "max_steps": 1}
    t = Trainer(parse_config(recipe, [f"output_dir={tmp_path}"]))
    batch = t.prepare_batch(1)
    one, streamed = streamed_grads(t, batch, (9, 2))
    assert_grads_close(one, streamed)
    assert t.train_step()["ratio_max_dev"] == 0.0
