"""The vLLM rollout engine (tasks/lm/vllm_engine.py) against the training forward. Needs vLLM: run
in the venv of scripts/make_vllm_env.sh as ``DIR/bin/python -m pytest -q -m vllm``; skipped
where vLLM is not importable and left out of the default run.

Tolerance: vLLM's processed log-probs of the sampled tokens and the training forward's
log-softmax(logits / temperature) agree within 1e-3 (fp32, max over every real token), the
benchmark's goal; they are computed by different kernels (vLLM's CPU attention and its own
sampler vs transformers' forward), so they are not bit-equal."""

import copy

import pytest
import torch
from helpers import TINY_RECIPE, tiny_overrides
from test_sharding import LM, assert_same, exported, launch, write

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy  # noqa: E402
from mmrl.tasks.lm.rollout_batches import eos_token_ids  # noqa: E402
from mmrl.tasks.lm.vllm_weights import export_weights  # noqa: E402

from mmrl.config.parse import parse_config  # noqa: E402
from mmrl.train.loop.trainer import Trainer  # noqa: E402
from mmrl.train.reporting.tracking import read_metrics  # noqa: E402

TOL = 1e-3
# vLLM's CPU attention takes head_dim 64 (not 16): hidden 256 over 4 heads
TINY = {"hidden": 256, "layers": 2, "heads": 4}
PROMPTS = ["1+2=", "3+4=", "12+5=", "9+9="]


@pytest.fixture(scope="module")
def policy():
    return CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", tiny_args=TINY, temperature=0.7,
                                         max_new_tokens=12, rollout_engine="vllm"))


def perturb(model, seed):
    """Move every weight in place (as an optimizer step does) by seeded noise."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen).to(p.dtype))


def max_gap(policy, rollout):
    """Max |vLLM's log-prob - the training forward's| over the real tokens, and the token count."""
    with torch.no_grad():
        logp, _ = policy.logprobs(policy.model, rollout)
    real = rollout.unit_mask.bool()
    assert rollout.rollout_logp is not None and real.sum() > 0
    return float((rollout.rollout_logp - logp)[real].abs().max()), int(real.sum())


def test_logprobs_match_the_training_forward_after_a_weight_sync(policy):
    policy.rollout(PROMPTS[:1], 2, [0])  # the engine is built with the initial weights
    perturb(policy.model, 1)
    rollout = policy.rollout(PROMPTS, 4, [1, 2, 3, 4])
    gap, tokens = max_gap(policy, rollout)
    assert tokens >= 16
    assert gap <= TOL, f"max |vllm - forward| = {gap} over {tokens} tokens"
    # the new weights were used: with the old ones the training forward disagrees
    old = copy.deepcopy(policy.model)
    perturb(old, 2)
    with torch.no_grad():
        logp_other, _ = policy.logprobs(old, rollout)
    assert float((rollout.rollout_logp - logp_other)[rollout.unit_mask.bool()].abs().max()) > 100 * TOL


def test_a_group_depends_on_its_prompt_and_seed_only(policy):
    whole = policy.rollout(PROMPTS, 4, [10, 11, 12, 13])
    alone = policy.rollout(PROMPTS[2:3], 4, [12])
    other_order = policy.rollout([PROMPTS[2], PROMPTS[0]], 4, [12, 10])
    rows = slice(8, 12)
    assert whole.completions[rows] == alone.completions == other_order.completions[:4]
    assert whole.completions[0:4] == other_order.completions[4:8]
    n = alone.num_units
    assert torch.allclose(whole.rollout_logp[rows, :n], alone.rollout_logp, atol=TOL)
    # and different seeds give different samples
    assert policy.rollout(PROMPTS[2:3], 4, [99]).completions != alone.completions


def test_lora_sync_is_exact():
    from peft import LoraConfig, get_peft_model
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", tiny_args=TINY, temperature=1.0,
                                           max_new_tokens=10, rollout_engine="vllm"))
    policy.model = get_peft_model(policy.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False))  # B != 0: a real delta
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    merged = dict(export_weights(policy.model, policy.parallel))
    reference = copy.deepcopy(policy.model).merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    for name, tensor in reference.items():
        assert torch.equal(merged[name], tensor), name
    base = dict(policy.model.get_base_model().named_parameters())
    q = next(n for n in reference if n.endswith("q_proj.weight"))
    assert not torch.equal(reference[q], base[q.replace("q_proj.weight", "q_proj.base_layer.weight")])
    rollout = policy.rollout(PROMPTS, 3, [5, 6, 7, 8])
    gap, _ = max_gap(policy, rollout)
    assert gap <= TOL
    after = policy.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the trained module is never merged in place


def test_three_steps_train_with_vllm_rollouts(tmp_path):
    recipe = {**TINY_RECIPE, "policy": {**TINY_RECIPE["policy"], "tiny_args": TINY, "rollout_engine": "vllm"}}
    cfg = parse_config(recipe, tiny_overrides(tmp_path / "run", max_steps=3))
    trainer = Trainer(cfg)
    start = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    trainer.train()
    moved = [n for n, p in trainer.unwrapped.named_parameters() if not torch.equal(p, start[n])]
    assert moved, "no weight changed in 3 steps"
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward_mean" in r]
    assert len(records) == 3 and all(r["reward_mean"] is not None for r in records)
    engine = trainer.policy._vllm
    assert engine is not None  # the rollouts came from vLLM
    # every rollout sampled with the weights of its step: the trainer's fused AdamW leaves the
    # parameters' version counters alone, so a missed sync would show here as a gap of ~1 or more
    assert all(r["rollout/logp_diff_max"] <= TOL for r in records), [r["rollout/logp_diff_max"] for r in records]


STOPS = [str(d) for d in range(10)] + ["+", "=", "ab"]


def test_stop_strings_end_vllm_completions_where_the_hf_mask_does():
    """vLLM stops at the token that completes a stop string (kept), as transformers does: the
    engine's raw ids (pad -1, so lengths are unambiguous) end where `_completion_mask` says,
    and the kept units' sampler log-probs still match the training forward."""
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", tiny_args=TINY, temperature=0.7,
                                           max_new_tokens=12, rollout_engine="vllm", stop_strings=STOPS))
    cfg = policy.cfg
    encoded = policy.tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_ids = [ids[m.bool()].tolist() for ids, m in zip(encoded["input_ids"], encoded["attention_mask"])]
    policy.rollout(PROMPTS[:1], 2, [0])  # builds the engine
    eos = eos_token_ids(policy.model, policy.tokenizer)
    raw, _ = policy._vllm.generate(
        policy.model, prompt_ids, 4, [1, 2, 3, 4], greedy=False, temperature=cfg.temperature, top_k=cfg.top_k,
        top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, min_new_tokens=0,
        stop_token_ids=eos, pad_token_id=-1, stop_strings=STOPS)
    lengths = (raw != -1).sum(1)
    ids = raw.masked_fill(raw == -1, policy.tokenizer.pad_token_id)
    mask, truncated = policy._completion_mask(ids)
    ends = mask.sum(1)
    stopped = 0
    for row in range(len(raw)):
        text = policy.tokenizer.decode(ids[row, :int(lengths[row])].tolist())
        prefix = policy.tokenizer.decode(ids[row, :int(lengths[row]) - 1].tolist())
        if any(s in text for s in STOPS):
            stopped += 1
            # the last token completes the first stop string: nothing generated past it
            assert not any(s in prefix for s in STOPS), (row, text)
        else:
            assert int(lengths[row]) == cfg.max_new_tokens or int(raw[row, lengths[row] - 1]) in eos, (row, text)
    assert stopped > 0, "no completion met a stop string: the test exercised nothing"
    # hf's rule (_completion_mask) ends each completion exactly where vLLM stopped
    assert ends.tolist() == lengths.tolist()
    rollout = policy.rollout(PROMPTS, 4, [1, 2, 3, 4])
    gap, tokens = max_gap(policy, rollout)
    assert gap <= TOL, f"max |vllm - forward| = {gap} over {tokens} tokens"


# 2 processes, each with its own engine (vLLM's external_launcher backend), against 1 process: the
# recipe of tests/test_sharding.py (a KL term, mu 2, micro-batches of 3 over groups of 4) with the
# vLLM-sized tiny model
LAUNCHED = dict(LM, policy={**LM["policy"], "tiny_args": TINY, "rollout_engine": "vllm"})


@pytest.mark.parametrize("strategy,lora", [("fsdp", False), ("fsdp", True), ("ddp", False)])
def test_vllm_rollouts_on_two_processes_match_one_process(tmp_path, strategy, lora):
    """With fsdp the engine of each process is sent the whole weights, gathered one shard unit at a
    time (LoRA merged); with ddp the process's own replica. Group g's samples depend on (prompt g,
    seed g) only, so the 2-process run draws the same completions as the 1-process run, and gives
    the same rewards, loss and updated weights, at test_sharding's tolerance (2e-5: the two runs sum
    gradients in different orders, ~1e-7 relative, which AdamW carries into the weights at about
    lr x 1e-4; the samples themselves are the same, as the equal rewards and lengths show). The
    rollout log-prob gap is compared at TOL (vLLM's kernels vs the training forward, ~1e-6 in fp32),
    and stays within it at every step: each engine samples with the weights of that step."""
    cfg = LAUNCHED if not lora else dict(LAUNCHED, optim={**LAUNCHED["optim"], "lr": 1e-2, "lora": {"r": 4, "alpha": 8}})
    recipe = write(tmp_path, cfg)
    one = launch(recipe, tmp_path / "one", processes=1)
    two = launch(recipe, tmp_path / "two", f"distributed.strategy={strategy}")
    assert any(r["loss"] != 0 for r in one) and any(r["kl"] > 0 for r in one[1:])
    steps = cfg["max_steps"]
    assert_same(one, two, exported(tmp_path / "one", steps), exported(tmp_path / "two", steps))
    for a, b in zip(one, two):
        assert a["completion_length"] == b["completion_length"]
        assert max(a["rollout/logp_diff_max"], b["rollout/logp_diff_max"]) <= TOL, (a["step"], a, b)
