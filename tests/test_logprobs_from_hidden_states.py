"""`policy.logprobs_from`: the token adapters' log-probs from the hidden states (the logits never
whole) equal those from the model's logits, with their entropies and the gradients of every
parameter, for the text, vision-language and audio families, with prefix sharing, temperature,
tied embeddings and LoRA on the output head; `policy.logprob_check` stops a run whose two paths
disagree."""

import logging

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from PIL import Image

from mmrl.errors import UserError
from mmrl.tasks.dlm.config import DLMConfig
from mmrl.tasks.dlm.policy import DLMPolicy
from mmrl.tasks.lm.audio_lm import AudioLMConfig, AudioLMPolicy
from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy
from mmrl.tasks.lm.output_head import OutputHead
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy

RNG = np.random.default_rng(0)
TOL, GRAD_TOL = 1e-5, 1e-4


def logprobs_and_grads(policy, batch, source):
    policy.cfg.logprobs_from = source
    weights = torch.linspace(-1, 1, batch.unit_mask.numel()).view_as(batch.unit_mask)
    logp, ent = policy.logprobs(policy.model, batch, with_entropy=True)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    loss = (logp * weights).sum() - 0.1 * (ent * batch.unit_mask).sum()  # an entropy bonus
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return logp, ent * batch.unit_mask, grads


def assert_paths_equal(policy, batch, sharing=("off", "on")):
    policy.cfg.logprob_check = False
    calls = head_outputs(policy)
    for mode in sharing:
        if hasattr(policy.cfg, "prefix_sharing"):
            policy.cfg.prefix_sharing = mode
        calls.clear()
        fused = logprobs_and_grads(policy, batch, "hidden_states")
        assert set(calls) == {"hidden"}  # the head passed hidden states: no logits were computed
        calls.clear()
        plain = logprobs_and_grads(policy, batch, "logits")
        assert set(calls) == {"logits"}
        assert (fused[0] - plain[0]).abs().max() <= TOL, mode
        assert (fused[1] - plain[1]).abs().max() <= TOL, mode
        assert fused[1].abs().max() > 0
        for gf, gp in zip(fused[2], plain[2]):
            assert (gf is None) == (gp is None)
            if gf is not None:
                assert (gf - gp).abs().max() <= GRAD_TOL, mode


def head_outputs(policy):
    """What the output head returns from now on, call by call: "hidden" (the hidden-state path)
    or "logits"."""
    calls = []
    head = policy.model.get_output_embeddings()
    head.register_forward_hook(lambda m, a, out: calls.append("logits" if out.shape[-1] == head.out_features
                                                              else "hidden"))
    return calls


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_text_model(temperature):
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=8, temperature=temperature))
    assert policy.model.config.tie_word_embeddings  # the head is the embedding: both uses get gradient
    batch = policy.rollout(["12+34=", "a longer prompt: 7*8="], 3, seeds=[1, 2])
    assert_paths_equal(policy, batch)


def test_text_model_with_lora_elsewhere_a_frozen_head():
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=8))
    policy.model = get_peft_model(policy.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert not OutputHead(policy.model).module.weight.requires_grad
    batch = policy.rollout(["12+34=", "5+6="], 3, seeds=[1, 2])
    assert_paths_equal(policy, batch, sharing=("off",))


def test_text_model_with_lora_on_the_output_head():
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=8))
    policy.model = get_peft_model(policy.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"]))
    head = OutputHead(policy.model).module
    assert head.base_layer is not head
    with torch.no_grad():
        for name in head.lora_B:
            head.lora_B[name].weight.normal_()  # an adapter that has trained: the head's weight moves
    batch = policy.rollout(["12+34=", "5+6="], 3, seeds=[1, 2])
    assert_paths_equal(policy, batch, sharing=("off",))
    policy.cfg.logprobs_from = "hidden_states"
    with policy.model.disable_adapter():  # the reference pass: the base head alone
        fused, _ = policy.logprobs(policy.model, batch)
        policy.cfg.logprobs_from = "logits"
        plain, _ = policy.logprobs(policy.model, batch)
    assert (fused - plain).abs().max() <= TOL


def test_image_model():
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", max_new_tokens=8))
    rows = [{"prompt": "where is it?", "image": Image.fromarray(RNG.integers(0, 255, (56, 84, 3), dtype=np.uint8))},
            {"prompt": "red?", "image": Image.fromarray(RNG.integers(0, 255, (112, 56, 3), dtype=np.uint8))}]
    batch = policy.rollout(rows, 2, seeds=[1, 2])
    assert policy.suppressed_tokens()  # the media placeholders are banned in both paths
    assert_paths_equal(policy, batch)


def test_audio_model():
    policy = AudioLMPolicy(AudioLMConfig(model="tiny:qwen2-audio-char", max_new_tokens=8))
    clip = {"array": RNG.standard_normal(16000).astype(np.float32) * 0.1, "sampling_rate": 16000}
    batch = policy.rollout([{"prompt": "what?", "audio": clip}, {"prompt": "say", "audio": clip}], 2, seeds=[1, 2])
    assert_paths_equal(policy, batch)


@pytest.mark.parametrize("estimator", ["diffu_grpo", "coupled", "elbo"])
def test_masked_diffusion_model(estimator):
    """Only each view's scored (masked) positions are projected; the estimator's sum is the same."""
    policy = DLMPolicy(DLMConfig(model="tiny:dlm-char", tiny_args={"hidden": 32, "layers": 1, "heads": 2},
                                 gen_length=8, block_length=4, steps=4, estimator=estimator, p_mask=0.5,
                                 elbo_points=2))
    batch = policy.rollout(["12+34=", "5+6="], 2, seeds=[1, 2])
    assert_paths_equal(policy, batch, sharing=("off",))


@pytest.mark.parametrize("estimator", ["diffu_grpo", "elbo"])
def test_the_masked_diffusion_check_holds_one_rows_logits_at_a_time(estimator):
    """The masked diffusion LM's check: each view's logits one row at a time ([1, C, V]), and the
    estimate equal to the whole micro-batch's."""
    policy = DLMPolicy(DLMConfig(model="tiny:dlm-char", tiny_args={"hidden": 32, "layers": 1, "heads": 2},
                                 gen_length=8, block_length=4, steps=4, estimator=estimator, p_mask=0.5,
                                 elbo_points=2))
    batch = policy.rollout(["12+34=", "5+6="], 2, seeds=[1, 2])
    views = policy.estimate(policy.estimator_inputs(batch))
    used = batch.unit_mask.shape[1]
    shapes = []
    head = policy.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, a, out: shapes.append(tuple(out.shape)))
    one_at_a_time = policy._plain_estimate(policy.model, batch.extras, views, used)
    handle.remove()
    assert shapes and all(s[0] == 1 for s in shapes) and len(shapes) >= len(batch)
    with torch.no_grad():
        whole, _ = policy._estimate(policy.model, batch.extras, views, used, None, False)
    torch.testing.assert_close(one_at_a_time, whole, atol=1e-5, rtol=0)


def test_the_default_path_is_the_hidden_states_and_the_check_passes_and_logs(caplog):
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=8))
    assert policy.cfg.logprobs_from == "hidden_states" and policy.cfg.logprob_check
    batch = policy.rollout(["12+34="], 2, seeds=[1])
    calls = head_outputs(policy)
    with caplog.at_level(logging.INFO, logger="mmrl.tasks.lm.scoring"):
        policy.logprobs(policy.model, batch)
        policy.logprobs(policy.model, batch)
    checks = [r.getMessage() for r in caplog.records if "logprob_check" in r.getMessage()]
    assert len(checks) == 1 and "max |logp difference|" in checks[0]  # the first micro-batch only
    assert calls == ["hidden", "logits", "logits", "hidden"]  # the check's plain pass once, a row at a time


def test_the_check_holds_one_rows_logits_at_a_time():
    """The check's plain pass projects one row's positions at a time: its whole logits are
    [1, C + 1, V], not the micro-batch's, and its log-probs are the batch pass's."""
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=8))
    batch = policy.rollout(["12+34=", "5+6="], 3, seeds=[1, 2])
    head = policy.model.get_output_embeddings()
    shapes = []
    handle = head.register_forward_hook(lambda m, a, out: shapes.append(tuple(out.shape)))
    ids, mask = batch.extras["completion_ids"], batch.unit_mask
    one_at_a_time = policy._plain_logprobs(policy.model, batch, ids, mask)
    handle.remove()
    assert len(shapes) == len(batch) == 6 and all(s[0] == 1 and s[-1] == head.out_features for s in shapes)
    with torch.no_grad():
        whole, _ = policy._token_logprobs(policy.model, batch.extras, ids, mask, policy.cfg.temperature, False)
    torch.testing.assert_close(one_at_a_time * mask, whole * mask, atol=1e-5, rtol=0)


def test_the_check_stops_a_run_whose_paths_disagree():
    """A model that changes its logits after the head in a way the head does not know (as an
    unlisted soft-capping would): the log-probs from the hidden states miss it."""
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=8))
    batch = policy.rollout(["12+34="], 2, seeds=[1])

    def scaled_logits(module, args, out):
        out.logits = out.logits * 1.5
        return out

    policy.model.register_forward_hook(scaled_logits)
    with pytest.raises(UserError, match=r"policy.logprob_check: .*max \|logp difference\| .*policy.logprobs_from: logits"):
        policy.logprobs(policy.model, batch)
    policy.cfg.logprob_check = False
    policy.logprobs(policy.model, batch)  # unchecked, the run would have trained on them


def test_a_model_that_transforms_its_logits_takes_the_logits_path(caplog):
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=8))
    batch = policy.rollout(["12+34="], 2, seeds=[1])
    policy.model.config.final_logit_softcapping = 30.0  # as Gemma 2 declares it
    calls = head_outputs(policy)
    with caplog.at_level(logging.WARNING, logger="mmrl.tasks.lm.scoring"):
        policy.logprobs(policy.model, batch)
    assert any("final_logit_softcapping=30.0" in r.getMessage() for r in caplog.records)
    assert calls == ["logits"]


def test_a_model_that_projects_without_calling_its_head_is_an_error():
    """A model whose forward multiplies by the head's weight itself (as some remote code does):
    its output is logits, not hidden states, and must not be taken for them."""
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=8))
    batch = policy.rollout(["12+34="], 2, seeds=[1])
    inner, head = policy.model.model, policy.model.lm_head

    def projects_itself(input_ids=None, logits_to_keep=0, **kwargs):
        hidden = inner(input_ids=input_ids, **kwargs).last_hidden_state[:, -logits_to_keep:]
        return type("Out", (), {"logits": hidden @ head.weight.T})()

    policy.model.forward = projects_itself
    with pytest.raises(UserError, match="without calling its output head.*policy.logprobs_from: logits"):
        policy.logprobs(policy.model, batch)
    policy.cfg.logprobs_from = "logits"
    assert policy.logprobs(policy.model, batch)[0].shape == batch.unit_mask.shape


def test_settings_are_checked():
    for bad, field in [({"logprobs_from": "probs"}, "policy.logprobs_from"),
                       ({"logprob_chunk_tokens": 0}, "policy.logprob_chunk_tokens"),
                       ({"logprob_check_tolerance": 0.0}, "policy.logprob_check_tolerance")]:
        problems = CausalLMPolicy.config_problems(CausalLMConfig(model="tiny:qwen2-char", **bad))
        assert problems and problems[0].startswith(field)
