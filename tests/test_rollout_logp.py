"""Rollout-time log-probs (`Rollout.rollout_logp`) and the rollout correction (TIS / MIS).

Per adapter, the rollout log-probs are compared with the training forward's in
tests/adapter_contract.py; here: the sampler's log-prob under top-k (the renormalised set), the
weights against a hand-written reference of TRL's token_truncate / token_mask rule, the loss
with the weights, and a training step with a known gap (its metrics and capped fraction)."""

import math

import pytest
import torch
from helpers import TINY_RECIPE
from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.config.parse import parse_config
from mmrl.core.objectives import policy_loss
from mmrl.core.rollout_correction import importance_weights, mismatch_metrics, mismatch_sums
from mmrl.errors import UserError
from mmrl.train.loop.trainer import Trainer

TINY = {"model": "tiny:qwen2-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2}, "max_new_tokens": 6}


def test_top_k_rollout_logp_is_renormalised_over_the_k_tokens():
    policy = CausalLMPolicy(CausalLMConfig(**TINY, top_k=3, temperature=0.5))
    batch = policy.rollout(["1+2=", "3+4="], 3, seeds=[1, 2])
    ids, mask = batch.extras["completion_ids"], batch.unit_mask.bool()
    prompt = batch.extras["prompt_ids"].shape[1]
    with torch.no_grad():  # reference: a plain forward, top 3 of logits / T, softmax over those 3
        full = torch.cat([batch.extras["prompt_ids"], ids], 1)
        attention = torch.cat([batch.extras["prompt_mask"], batch.unit_mask.long()], 1)
        logits = policy.model(input_ids=full, attention_mask=attention,
                              position_ids=(attention.cumsum(-1) - 1).clamp(min=0)).logits[:, prompt - 1:-1] / 0.5
    top = logits.topk(3, dim=-1)
    assert (top.indices == ids[..., None]).any(-1)[mask].all()  # every drawn token is in its top 3
    chosen = logits.gather(-1, ids[..., None]).squeeze(-1)
    reference = chosen - torch.logsumexp(top.values, dim=-1)
    assert torch.allclose(batch.rollout_logp[mask], reference[mask], atol=1e-5)
    assert (batch.rollout_logp[~mask] == 0).all()


def test_concat_pads_rollout_logp_with_the_units():
    policy = CausalLMPolicy(CausalLMConfig(**TINY))
    a = policy.rollout(["1+2="], 2, seeds=[1])
    b = policy.rollout(["3+4="], 2, seeds=[2])
    a = a.select([0, 1])
    a.unit_mask, a.rollout_logp = a.unit_mask[:, :3], a.rollout_logp[:, :3]  # a narrower part
    a.extras["completion_ids"] = a.extras["completion_ids"][:, :3]
    both = policy.concat([a, b])
    assert both.rollout_logp.shape == both.unit_mask.shape == (4, b.num_units)
    assert torch.equal(both.rollout_logp[:2, :3], a.rollout_logp) and (both.rollout_logp[:2, 3:] == 0).all()
    assert torch.equal(both.select([3, 2]).rollout_logp, b.rollout_logp.flip(0))


def reference_weights(old, rollout, kind, cap):
    """TRL's token_truncate / token_mask (upper bound only), one unit at a time."""
    out, capped = [], []
    for o, r in zip(old, rollout):
        rho = math.exp(o - r)
        capped.append(rho > cap)
        out.append(min(rho, cap) if kind == "tis" else (0.0 if rho > cap else rho))
    return out, capped


@pytest.mark.parametrize("kind", ["tis", "mis"])
def test_importance_weights_match_a_hand_written_reference(kind):
    old = [-1.0, -2.0, -0.5, -3.0, -0.1]
    rollout = [-1.0, -2.5, -1.5, -2.0, -0.8]  # rho = 1, e^0.5, e^1, e^-1, e^0.7
    weight, capped = importance_weights(torch.tensor([old]), torch.tensor([rollout]), kind, 2.0)
    ref, ref_capped = reference_weights(old, rollout, kind, 2.0)
    assert torch.allclose(weight[0], torch.tensor(ref), atol=1e-6)
    assert capped[0].tolist() == ref_capped == [False, False, True, False, True]
    with pytest.raises(ValueError, match="rollout_correction"):
        importance_weights(torch.tensor([old]), torch.tensor([rollout]), "token", 2.0)


def test_the_weights_scale_the_surrogate_but_not_the_kl():
    cfg = AlgorithmConfig(beta=0.1, eps_low=0.2, eps_high=0.2)
    logp = torch.tensor([[-1.0, -0.9, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -0.9, -1.5]])
    ref = torch.tensor([[-1.0, -1.2, -1.7]])
    adv, mask, weights = torch.tensor([0.5]), torch.ones(1, 3), torch.full((1, 3), 1 / 3)
    w = torch.tensor([[0.5, 2.0, 0.0]])
    terms = policy_loss(logp, old, adv, mask, weights, cfg, ref_logp=ref, is_weight=w)
    expected = 0.0
    for u in range(3):  # -A min(rho A, clip(rho) A) * w + beta k3, averaged over the 3 units
        rho = math.exp(logp[0, u].item() - old[0, u].item())
        pg = max(-0.5 * rho, -0.5 * min(max(rho, 0.8), 1.2))
        x = ref[0, u].item() - logp[0, u].item()
        expected += (pg * w[0, u].item() + 0.1 * (math.exp(x) - x - 1)) / 3
    assert terms.loss.item() == pytest.approx(expected, abs=1e-6)


def test_mismatch_metrics_over_real_units_only():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 9.0]])
    rollout = torch.tensor([[-1.5, -2.0, -1.0], [-0.5, -0.2, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the 9.0 gap is padding
    _, capped = importance_weights(old, rollout, "tis", 1.5)
    sums = mismatch_sums(old, rollout, mask, capped)
    metrics = mismatch_metrics([sums, {**sums}], "tis")  # two processes alike
    assert metrics["rollout/logp_diff_mean"] == pytest.approx((0.5 + 0 + 2 + 0 + 0.3) / 5)
    assert metrics["rollout/logp_diff_max"] == pytest.approx(2.0)
    assert metrics["rollout/capped_frac"] == pytest.approx(1 / 5)  # rho = e^0.5 > 1.5; the padding's e^9 not counted
    assert mismatch_metrics([{"loss": 0.0}], "none") == {}


def trainer(tmp_path, *overrides):
    return Trainer(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", *overrides]))


@pytest.mark.parametrize("kind", ["tis", "mis"])
def test_a_known_gap_is_measured_and_capped(tmp_path, kind):
    """The sampler's log-probs shifted by a known amount on some units: the step logs that gap
    and caps exactly the units whose ratio exceeds the cap; MIS's gradient is the gradient with
    those units dropped and the others weighted by rho."""
    t = trainer(tmp_path, f"algorithm.rollout_correction={kind}", "algorithm.rollout_correction_cap=2.0")
    batch = t.prepare_batch(1)
    r = batch.rollout
    shift = torch.zeros_like(r.rollout_logp)
    shift[::2, ::2] = 1.0    # rho = e^1 > 2: capped
    shift[1::2, 1::2] = -0.25  # rho = e^-0.25 < 2
    r.rollout_logp = r.rollout_logp - shift
    trained = r.unit_mask.bool() & batch.row_mask[:, None] & (batch.advantages != 0)[:, None]
    assert trained.any()
    metrics = t.updater.update(batch)
    assert metrics["rollout/logp_diff_max"] == pytest.approx(1.0, abs=1e-4)
    expected_mean = float(shift[trained].abs().mean())
    assert metrics["rollout/logp_diff_mean"] == pytest.approx(expected_mean, abs=1e-4)
    assert metrics["rollout/capped_frac"] == pytest.approx(float((shift[trained] == 1.0).float().mean()))


@pytest.mark.parametrize("kind", ["tis", "mis"])
def test_the_corrected_gradient_is_the_gradient_with_reweighted_units(tmp_path, kind):
    """TIS: every unit's weight is min(rho, C); MIS: rho, and 0 for the capped units."""
    t = trainer(tmp_path, f"algorithm.rollout_correction={kind}", "algorithm.rollout_correction_cap=2.0")
    batch = t.prepare_batch(1)
    r = batch.rollout
    shift = torch.zeros_like(r.rollout_logp)
    shift[:, ::3] = 1.0      # capped: dropped
    shift[:, 1::3] = -0.5    # rho = e^-0.5: weighted
    r.rollout_logp = r.rollout_logp - shift
    chunks = t.updater.micro_batches(batch)
    t.optimizer.zero_grad(set_to_none=True)
    t.updater.accumulate_gradients(batch, chunks, None, None, with_entropy=False)
    corrected = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
    # reference: no correction, with the aggregation weights multiplied by each unit's MIS weight
    t.cfg.algorithm.rollout_correction = "none"
    rho = torch.exp(shift)
    unit_weight = rho.clamp(max=2.0) if kind == "tis" else torch.where(rho > 2.0, 0.0, rho)
    reference = type(batch)(r, batch.advantages, batch.row_mask, batch.weights * unit_weight, batch.metrics)
    t.optimizer.zero_grad(set_to_none=True)
    t.updater.accumulate_gradients(reference, chunks, None, None, with_entropy=False)
    for n, p in t.model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(corrected[n], p.grad, atol=1e-6, rtol=1e-4), n


def test_correction_without_rollout_logp_is_a_clear_error(tmp_path):
    t = trainer(tmp_path, "algorithm.rollout_correction=tis")
    batch = t.prepare_batch(1)
    batch.rollout.rollout_logp = None
    with pytest.raises(UserError, match="algorithm.rollout_correction='tis' needs the rollout sampler's log-probs"):
        t.updater.update(batch)


def test_the_cap_must_be_positive(tmp_path):
    with pytest.raises(Exception, match="rollout_correction_cap"):
        trainer(tmp_path, "algorithm.rollout_correction_cap=0")


def test_the_samplers_min_new_tokens_ban_draws_what_generates_own_processor_does():
    """The sampler bans EOS for the first min_new_tokens itself (one processor per decoding step);
    reference: transformers' min_new_tokens processor in front of a sampler without the ban. EOS is
    made the likeliest token, so the ban decides every row's first tokens."""
    from transformers import GenerationConfig
    from mmrl.tasks.lm.seeded_sampler import GroupSeededSampler
    policy = CausalLMPolicy(CausalLMConfig(**TINY, min_new_tokens=4, shared_prefill=False))
    eos, prompts, seeds = policy.tokenizer.eos_token_id, ["1+2=", "3+4="], [5, 6]
    rows = policy._expand(policy._encode_prompts(prompts), 3)
    inputs = policy._model_inputs(rows)
    with torch.no_grad():  # the EOS row of the output layer along the mean final hidden state: EOS first
        hidden = policy.model(**inputs, output_hidden_states=True).hidden_states[-1].mean((0, 1))
        policy.model.lm_head.weight[eos] = 100 * hidden / hidden.norm() ** 2
    batch = policy.rollout(prompts, 3, seeds)
    reference = GroupSeededSampler(seeds, 3, 1.0, 0, 1.0)
    sequences = policy.model.generate(**inputs, logits_processor=[reference], generation_config=GenerationConfig(
        max_new_tokens=6, min_new_tokens=4, do_sample=False, pad_token_id=policy.tokenizer.pad_token_id,
        eos_token_id=eos))
    expected = sequences[:, rows["prompt_ids"].shape[1]:]
    ids = batch.extras["completion_ids"]
    assert (expected[:, :4] != eos).all() and (expected[:, 4] == eos).all()  # the ban, then EOS at once
    assert torch.equal(ids[:, :5], expected[:, :5])
    assert torch.allclose(batch.rollout_logp[:, :5], reference.sampled_logp(6)[:, :5], atol=1e-6)


def test_the_sampler_keeps_nothing_of_the_vocabulary_between_steps():
    """What the sampler keeps per decoding step for `sampled_logp` is two numbers per row, not a view
    that holds the step's probabilities [N, V] alive for the whole rollout (512 steps of a 152k-token
    vocabulary would hold 5 GB for 16 rows)."""
    from mmrl.tasks.lm.seeded_sampler import GroupSeededSampler
    rows, vocab = 6, 1000
    for top_k, top_p in ((0, 1.0), (5, 1.0), (0, 0.9)):
        sampler = GroupSeededSampler([1, 2], 3, 0.7, top_k, top_p, eos_ids=[0], min_new_tokens=2)
        for step in range(4):
            sampler(torch.zeros(rows, 3 + step, dtype=torch.long), torch.randn(rows, vocab))
        kept = [t.untyped_storage().nbytes() for pair in sampler.drawn for t in pair]
        assert len(kept) == 8 and max(kept) == rows * 4  # fp32 [N, 1] each
