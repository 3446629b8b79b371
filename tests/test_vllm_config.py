"""`policy.rollout_engine: vllm` is checked with the recipe, before any model loads: adapters
without vLLM support are refused, and a missing vLLM names how to install it. (The engine itself
is tested in tests/test_vllm.py, in the venv of scripts/make_vllm_env.sh.)"""

import mmrl.tasks.lm.vllm_config as vllm_config
import pytest
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.config.parse import ConfigError, parse_config
from mmrl.train.loop.trainer import Trainer


def problems(tmp_path, *overrides, recipe=TINY_RECIPE):
    with pytest.raises(ConfigError) as info:
        Trainer(parse_config(recipe, tiny_overrides(tmp_path / "run") + list(overrides)))
    return str(info.value)


def test_missing_vllm_names_the_install(tmp_path, no_model, monkeypatch):
    monkeypatch.setattr(vllm_config, "vllm_available", lambda: False)
    message = problems(tmp_path, "policy.rollout_engine=vllm")
    assert "policy.rollout_engine=vllm but vllm is not importable" in message
    assert "pip install -e '.[vllm]'" in message and "scripts/make_vllm_env.sh" in message


def test_vllm_settings_are_checked(tmp_path, no_model, monkeypatch):
    monkeypatch.setattr(vllm_config, "vllm_available", lambda: True)
    message = problems(tmp_path, "policy.rollout_engine=vllm", "policy.vllm.gpu_memory_utilization=1.5",
                       "policy.vllm.tensor_parallel_size=0")
    assert "policy.vllm.gpu_memory_utilization=1.5 must be in (0, 1]" in message
    assert "policy.vllm.tensor_parallel_size=0 must be >= 1" in message
    assert "not importable" not in message


def test_unknown_engine_and_vllm_key_are_refused(tmp_path, no_model):
    assert "policy.rollout_engine: 'sglang' is not one of ['hf', 'vllm']" in problems(
        tmp_path, "policy.rollout_engine=sglang")
    message = problems(tmp_path, "policy.vllm.gpu_mem=0.5")
    assert "unknown config key 'policy.vllm.gpu_mem'" in message and "gpu_memory_utilization" in message


def test_adapters_without_vllm_support_refuse_it(tmp_path, no_model, monkeypatch):
    monkeypatch.setattr(vllm_config, "vllm_available", lambda: True)
    audio = {**TINY_RECIPE, "task": "audio_lm", "policy": {"model": "tiny:qwen2-audio-char", "max_new_tokens": 8}}
    message = problems(tmp_path, "policy.rollout_engine=vllm", recipe=audio)
    assert "policy.rollout_engine='vllm': the AudioLMPolicy adapter supports hf" in message


def test_vlm_takes_vllm_for_images_and_videos_and_checks_its_media_limits(tmp_path, no_model, monkeypatch):
    from mmrl.train.plan.validate import validate
    monkeypatch.setattr(vllm_config, "vllm_available", lambda: True)
    vlm = {**TINY_RECIPE, "task": "vlm", "policy": {"model": "tiny:qwen2.5-vl-char", "max_new_tokens": 8}}
    validate(parse_config(vlm, tiny_overrides(tmp_path / "run") + ["policy.rollout_engine=vllm",
                                                                   "policy.shuffled_rollouts=2"]))
    message = problems(tmp_path, "policy.rollout_engine=vllm", "policy.vllm.max_images_per_prompt=0",
                       "policy.vllm.max_videos_per_prompt=-1", recipe=vlm)
    assert "policy.vllm.max_images_per_prompt=0 must be >= 1" in message
    assert "policy.vllm.max_videos_per_prompt=-1 must be >= 0" in message


def test_vllm_under_fsdp_is_accepted_but_an_engine_cannot_span_processes(tmp_path, no_model, monkeypatch):
    """fsdp + vllm passes the recipe check (each process's engine is sent the gathered weights); a
    tensor-parallel engine under several processes is refused: every process drives an engine of
    its own on its own prompts."""
    from mmrl.train.plan.validate import validate
    monkeypatch.setattr(vllm_config, "vllm_available", lambda: True)
    base = tiny_overrides(tmp_path / "run") + ["policy.rollout_engine=vllm", "distributed.strategy=fsdp"]
    validate(parse_config(TINY_RECIPE, base), num_processes=2)
    validate(parse_config(TINY_RECIPE, base + ["policy.vllm.tensor_parallel_size=2"]), num_processes=1)
    with pytest.raises(ConfigError) as info:
        validate(parse_config(TINY_RECIPE, base + ["policy.vllm.tensor_parallel_size=2"]), num_processes=2)
    assert "policy.vllm.tensor_parallel_size=2 with 2 processes" in str(info.value)


def test_a_prompt_with_more_media_than_vllm_plans_for_is_refused_naming_the_setting():
    """Checked on the prompts sent to vLLM, before the engine sees them (no vLLM needed)."""
    import numpy as np
    from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", vllm=vllm_config.VLLMConfig(max_videos_per_prompt=0)))
    row = {"prompt": "which way?", "video": np.zeros((4, 28, 28, 3), np.uint8)}
    with pytest.raises(ValueError, match=r"1 videos, more than policy.vllm.max_videos_per_prompt=0"):
        policy._vllm_prompts(policy._prompt_parts([row]), [[0]])
    request, = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char"))._vllm_prompts(policy._prompt_parts([row]), [[0]])
    frames, metadata = request["multi_modal_data"]["video"][0]
    assert frames.shape == (4, 28, 28, 3) and metadata["frames_indices"] == [0, 1, 2, 3]
