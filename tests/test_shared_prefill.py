"""Shared prefill in the rollout: each prompt is prefilled once and its KV cache repeated for its
group. The samples must equal those of prefilling every group member, for the text, vision and
audio tiny models, with prompts of different lengths and images of different sizes."""

import numpy as np
import pytest
import torch
from mmrl.tasks.lm.audio_lm import AudioLMConfig, AudioLMPolicy
from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy
from mmrl.tasks.lm.generation import KV_CACHE
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy
from PIL import Image

RNG = np.random.default_rng(0)


def image(h, w):
    return Image.fromarray(RNG.integers(0, 255, (h, w, 3), dtype=np.uint8))


def clip(seconds, rate):
    return {"array": RNG.standard_normal(int(seconds * rate)) * 0.1, "sampling_rate": rate}


CASES = {
    "text": (lambda: CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=12)),
             ["12+34=", "5+6=", "a longer prompt, padded less"]),
    "vlm": (lambda: VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", max_new_tokens=8)),
            [{"prompt": "where is it?", "image": image(56, 84)},
             {"prompt": "red?", "image": image(112, 56)},
             {"prompt": "two images", "image": [image(56, 56), image(28, 56)]}]),
    "audio": (lambda: AudioLMPolicy(AudioLMConfig(model="tiny:qwen2-audio-char", max_new_tokens=8)),
              [{"prompt": "what?", "audio": clip(0.5, 8000)},
               {"prompt": "who speaks here?", "audio": clip(1.5, 16000)}]),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    make, rows = CASES[request.param]
    return make(), rows


def rollout(policy, rows, shared, **kwargs):
    policy.cfg.shared_prefill = shared
    try:
        return policy.rollout(rows, 4, seeds=list(range(7, 7 + len(rows))), **kwargs)
    finally:
        policy.cfg.shared_prefill = True


def test_shared_prefill_samples_equal_the_plain_prefill(case):
    policy, rows = case
    shared, plain = rollout(policy, rows, True), rollout(policy, rows, False)
    assert shared.completions == plain.completions
    assert torch.equal(shared.extras["completion_ids"], plain.extras["completion_ids"])
    assert torch.equal(shared.unit_mask, plain.unit_mask)
    assert len(set(shared.completions)) > len(rows)  # real samples, not one string per group
    greedy_shared, greedy_plain = rollout(policy, rows, True, greedy=True), rollout(policy, rows, False, greedy=True)
    assert greedy_shared.completions == greedy_plain.completions


def test_first_step_on_the_repeated_cache_equals_a_plain_prefill(case):
    """The logits the first sample is drawn from, per row: last prompt token on the repeated
    cache (with the model's own positions, multimodal rotary ones included) vs the whole prompt."""
    policy, rows = case
    encoded = policy._encode_prompts(rows)
    expanded = policy._expand(encoded, 3)
    inputs = policy._shared_prefill(encoded, expanded, 3)
    with torch.no_grad():
        step = policy.model(input_ids=inputs["input_ids"][:, -1:], attention_mask=inputs["attention_mask"],
                            position_ids=inputs["position_ids"][..., -1:], **{KV_CACHE: inputs[KV_CACHE]})
        whole = policy.model(**policy._model_inputs(expanded))
    assert torch.allclose(step.logits[:, -1], whole.logits[:, -1], atol=1e-5)


def test_one_token_prompts_fall_back_to_the_plain_prefill():
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=6))
    encoded = policy._encode_prompts(["7", "8"])
    assert policy._shared_prefill(encoded, policy._expand(encoded, 2), 2) is None
    assert rollout(policy, ["7", "8"], True).completions == rollout(policy, ["7", "8"], False).completions


def test_shared_prefill_under_a_lora_wrapper():
    """The engine's LoRA wraps the model in PEFT, whose forward hides the model's arguments: the
    multimodal positions must still come from the model's own rule."""
    from peft import LoraConfig, get_peft_model
    make, rows = CASES["vlm"]
    policy = make()
    policy.model = get_peft_model(policy.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for name, p in policy.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    shared = rollout(policy, rows, True)
    assert shared.completions == rollout(policy, rows, False).completions
    with policy.model.disable_adapter():
        assert rollout(policy, rows, True).completions != shared.completions  # the adapter is live


def test_rollouts_raise_no_deprecation_from_transformers(case):
    """generate gets its KV cache under the name the installed transformers takes: no FutureWarning,
    no DeprecationWarning, no 'deprecated' log line (warning_once's memory cleared first)."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging
    policy, rows = case
    hf_logging.warning_once.cache_clear()
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    hf_logger = logging.getLogger("transformers")
    hf_logger.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            for shared in (True, False):
                rollout(policy, rows, shared)
                rollout(policy, rows, shared, greedy=True)
    finally:
        hf_logger.removeHandler(handler)
    assert not [line for line in lines if "deprecat" in line.lower()], lines
