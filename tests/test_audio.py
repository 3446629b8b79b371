"""The audio LM adapter on a tiny random Qwen2-Audio: clips from files and arrays at other rates,
batch-size invariance, exact on-policy log-probs, a training step, broken files named."""

from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from mmrl.tasks.lm.audio_lm import AudioLMConfig, AudioLMPolicy, load_audio

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def policy():
    return AudioLMPolicy(AudioLMConfig(model="tiny:qwen2-audio-char", max_new_tokens=5))


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("audio") / "clip.wav"
    soundfile.write(path, (RNG.standard_normal(8000) * 0.1).astype(np.float32), 8000)
    return [{"prompt": "what?", "audio": str(path)},
            {"prompt": "who speaks?", "audio": {"array": RNG.standard_normal(24000) * 0.1, "sampling_rate": 16000}}]


def test_load_audio_resamples_and_names_broken_files(tmp_path):
    clip = load_audio({"array": np.ones(8000, dtype=np.float32) * 0.1, "sampling_rate": 8000}, 16000)
    assert clip.shape == (16000,)
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF not really")
    with pytest.raises(ValueError, match="broken.wav"):
        load_audio(str(bad), 16000)


def test_rows_equal_the_row_alone_and_ratio_is_one(policy, rows):
    assert policy.suppressed_tokens()  # the <|AUDIO|> placeholder is never sampled
    batch = policy.rollout(rows, 2, seeds=[1, 2])
    alone = policy.rollout(rows[1:], 2, seeds=[2])
    assert alone.completions == batch.completions[2:]
    full, _ = policy.logprobs(policy.model, batch)
    single, _ = policy.logprobs(policy.model, alone)
    assert torch.allclose(full[2:, :single.shape[1]], single, atol=1e-5)
    with torch.no_grad():
        old, _ = policy.logprobs(policy.model, batch)
    assert torch.equal(old, full)


def test_a_training_step_changes_encoder_and_decoder(tmp_path, rows):
    import json
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "audio": rows[0]["audio"]}) + "\n" for i in range(4)))
    recipe = {"task": "audio_lm", "policy": {"model": "tiny:qwen2-audio-char", "max_new_tokens": 5},
              "data": {"path": str(data)}, "rewards": {"digit_share": {"weight": 1.0}},
              "reward_modules": [str(Path(__file__).parent / "digit_reward.py")],
              "algorithm": {"group_size": 4}, "optim": {"lr": 1e-2, "prompts_per_step": 2},
              "logging": {"report_to": ["none"], "progress": False}, "output_dir": str(tmp_path / "run")}
    t = Trainer(parse_config(recipe))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    t.train_step()
    changed = [n for n, p in t.model.named_parameters() if not torch.equal(before[n], p)]
    assert any("audio_tower" in n for n in changed) and any("language_model" in n for n in changed)
