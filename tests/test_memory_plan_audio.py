"""`mmrl plan` for the audio LM (tasks/lm/audio_memory_formula.py): the clip's tokens against the
processor's, the audio encoder's activations against the tensors autograd saves in its forward, the
whole step against the allocation probe (scripts/memory_probe.py), and what it refuses by name."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch

from test_memory_plan import measured_peak

from mmrl.cli.main import main
from mmrl.config.parse import from_dict, parse_config
from mmrl.experiments.memory_plan import plan_memory
from mmrl.registry import ADAPTERS


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))


def audio_recipe(hidden, tokens, audio_hidden=32, window=2, clip=1.9, checkpointing=False):
    """bench_memory_plan's step for the audio_lm adapter: 2 prompts x 2 completions of `tokens`
    tokens, one `clip`-second tone per prompt in a `window`-second encoder window."""
    from bench_memory_plan import AUDIO_PROMPT_TOKENS, recipe
    args = argparse.Namespace(task="audio_lm", audio_hidden=audio_hidden, window=window, clip_seconds=clip, layers=2,
                              vocab=0, group=2, checkpointing=checkpointing, estimator="diffu_grpo",
                              logprobs_from="logits", vlm_model="", vision_hidden=32, image_side=112)
    return recipe(hidden, tokens, args), AUDIO_PROMPT_TOKENS


def formula_of(recipe, prompt):
    cfg = parse_config(recipe)
    adapter = ADAPTERS.get(cfg.task)
    return adapter.memory_model(from_dict(adapter.Config, cfg.policy, "policy"), prompt)


def test_the_clip_tokens_are_the_processors(scripts):
    """A clip filling the 2-second window: the formula's audio tokens are the processor's expansion of
    the placeholder, and the bench's prompt length is the chat text without them."""
    from mmrl.tasks.model_loading import load_tiny
    recipe, prompt = audio_recipe(64, 8)
    formula = formula_of(recipe, prompt)
    _, processor = load_tiny("tiny:qwen2-audio-char", {"max_seconds": 2}, "float32")
    chat = processor.apply_chat_template([{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "01+20="}]}],
                                         add_generation_prompt=True, tokenize=False)
    enc = processor(text=[chat], audio=[np.ones(32000, dtype=np.float32)], sampling_rate=16000, return_tensors="pt")
    clip_tokens = int((enc["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<|AUDIO|>")).sum())
    assert formula.audio_tokens == clip_tokens == 50
    assert enc["input_ids"].shape[1] - clip_tokens + 1 == prompt  # the placeholder counted, as the vlm's
    assert tuple(enc["input_features"].shape) == (1, formula.mel_bins, 2 * formula.frames)


def saved_bytes(model, features, mask) -> int:
    """Bytes of the distinct tensors (not parameters) autograd saves in the encoder's forward and the
    projection to the decoder's width."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model.multi_modal_projector(model.model.audio_tower(features, attention_mask=mask).last_hidden_state)
    return sum(seen.values())


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_encoder_activations_are_the_saved_tensors(checkpointing):
    """A Qwen2-Audio encoder of a size the counts were not read at (width 48, 2 layers, feed-forward
    144, 3 heads, 150 positions, 2 clips shorter than the window): the formula's bytes are those
    autograd saves in its forward and the projection's."""
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration
    from transformers.masking_utils import create_bidirectional_mask

    from mmrl.tasks.lm.audio_memory_formula import AudioLanguageMemory
    config = Qwen2AudioConfig(audio_config=dict(d_model=48, encoder_layers=2, encoder_attention_heads=3,
                                                encoder_ffn_dim=144, num_mel_bins=80, max_source_positions=150),
                              text_config=dict(model_type="qwen2", vocab_size=100, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    model = Qwen2AudioForConditionalGeneration._from_config(config, attn_implementation="sdpa").train()
    tower = model.model.audio_tower
    if checkpointing:
        tower.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    frames = torch.ones(2, 150, dtype=torch.long)
    frames[:, 120:] = 0  # the clips' padding in the window
    mask = create_bidirectional_mask(config=tower.config, inputs_embeds=torch.zeros(2, 150, 1), attention_mask=frames)
    measured = saved_bytes(model, torch.randn(2, 80, 300), mask)
    cfg = argparse.Namespace(model="tiny", gradient_checkpointing=checkpointing, max_new_tokens=4, logprob_chunk_tokens=64,
                             logprob_chunk_rows=1, logprob_check=False)
    formula = AudioLanguageMemory(model, cfg, prompt_length=4)
    assert formula.encoder_bytes(2, checkpointing) == pytest.approx(measured, rel=0.005)


def test_the_audio_plan_predicts_the_probed_step(scripts):
    """The tiny Qwen2-Audio (hidden 64, an encoder of width 32), 1.9-second clips in a 2-second
    window, 4 completions of 32 tokens: the plan's peak within 15% of the probe's."""
    recipe, prompt = audio_recipe(64, 32)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=prompt)
    assert plan.peak == pytest.approx(measured_peak(recipe), rel=0.15)


@pytest.mark.slow  # 6-8 s each under the profiler here (2026-11-30), more on the loaded machine
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_audio_plan_where_the_encoder_is_the_peak(scripts, checkpointing):
    """A 10-second window (500 positions) through an encoder of width 128, hidden 256, 128 completion
    tokens, with and without activation checkpointing: within 15%."""
    recipe, prompt = audio_recipe(256, 128, audio_hidden=128, window=10, clip=9, checkpointing=checkpointing)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=prompt)
    assert plan.peak == pytest.approx(measured_peak(recipe), rel=0.15)


@pytest.mark.parametrize("setting,named", [("policy.model=tiny:qwen2.5-omni-thinker-char", "qwen2_5_omni_audio_encoder"),
                                           ("policy.attn_implementation=eager", "policy.attn_implementation")])
def test_what_the_audio_formula_does_not_model_is_named(setting, named, capsys):
    assert main(["plan", "asr", setting, "policy.tiny_args={}", "--prompt-tokens", "16"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err
