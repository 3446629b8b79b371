"""The causal LM adapter: seeded group sampling, exact on-policy log-probs, token log-probs."""

import pytest
import torch
from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy
from mmrl.tasks.lm.token_logprobs import selective_log_softmax


@pytest.fixture(scope="module")
def policy():
    return CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=10))


def test_selective_log_softmax_matches_log_softmax_and_its_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 13, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (2, 7))
    logp, ent = selective_log_softmax(logits, targets, chunk_rows=3, with_entropy=True)
    ref = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    ref_ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    assert torch.allclose(logp.double(), ref, atol=1e-6)
    assert torch.allclose(ent.double(), ref_ent, atol=1e-6)
    w = torch.randn(2, 7, dtype=torch.float64)
    g, = torch.autograd.grad((logp * w).sum(), logits)
    g_ref, = torch.autograd.grad((ref * w).sum(), logits)
    assert torch.allclose(g, g_ref, atol=1e-6)


def test_selective_log_softmax_entropy_has_its_gradient():
    """An entropy bonus trains: the entropy's gradient is the autograd gradient of -sum p log p."""
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 13, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (2, 7))
    logp, ent = selective_log_softmax(logits, targets, chunk_rows=3, with_entropy=True)
    ref_ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    w = torch.randn(2, 7, dtype=torch.float64)
    g, = torch.autograd.grad((ent * w).sum() + logp.sum(), logits)
    ref = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    g_ref, = torch.autograd.grad((ref_ent * w).sum() + ref.sum(), logits)
    assert torch.allclose(g, g_ref, atol=1e-6)


def test_group_sampling_depends_only_on_prompt_and_seed(policy):
    both = policy.rollout(["12+34=", "5+6="], 4, seeds=[1, 2])
    alone = policy.rollout(["5+6="], 4, seeds=[2])
    assert both.completions[4:] == alone.completions
    assert torch.equal(both.extras["completion_ids"][4:, :alone.num_units], alone.extras["completion_ids"])
    other_seed = policy.rollout(["5+6="], 4, seeds=[3])
    assert other_seed.completions != alone.completions
    assert both.group_id.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_on_policy_logprobs_are_exactly_reproducible(policy):
    r = policy.rollout(["12+34=", "5+6="], 3, seeds=[1, 2])
    with torch.no_grad():
        old, _ = policy.logprobs(policy.model, r)
    new, _ = policy.logprobs(policy.model, r)
    assert torch.equal(old, new)  # ratio exp(new - old) is exactly 1
    part, _ = policy.logprobs(policy.model, r.select([3, 4, 5]))
    assert torch.allclose(part, new[3:], atol=1e-5)
    assert (new * (1 - r.unit_mask)).abs().sum() == 0


def test_logprobs_match_a_plain_forward(policy):
    r = policy.rollout(["7+8="], 2, seeds=[5])
    logp, _ = policy.logprobs(policy.model, r)
    ids = torch.cat([r.extras["prompt_ids"], r.extras["completion_ids"]], 1)
    logits = policy.model(input_ids=ids).logits[:, r.extras["prompt_ids"].shape[1] - 1:-1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, r.extras["completion_ids"][..., None]).squeeze(-1)
    assert torch.allclose(logp * r.unit_mask, ref * r.unit_mask, atol=1e-5)


def test_temperature_scales_the_distribution():
    hot = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=4, temperature=2.0))
    r = hot.rollout(["1+1="], 2, seeds=[0])
    logp, _ = hot.logprobs(hot.model, r)
    ids = torch.cat([r.extras["prompt_ids"], r.extras["completion_ids"]], 1)
    logits = hot.model(input_ids=ids).logits[:, r.extras["prompt_ids"].shape[1] - 1:-1].float() / 2.0
    ref = torch.log_softmax(logits, -1).gather(-1, r.extras["completion_ids"][..., None]).squeeze(-1)
    assert torch.allclose(logp * r.unit_mask, ref * r.unit_mask, atol=1e-5)


def test_truncated_completions_can_be_masked():
    cfg = CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=6, mask_truncated=True)
    p = CausalLMPolicy(cfg)
    r = p.rollout(["1+1="], 8, seeds=[0])
    assert r.truncated.any()  # a random model rarely emits eos within 6 tokens
    assert (r.unit_mask[r.truncated].sum() == 0)


def test_completion_mask_stops_after_eos(policy):
    eos, pad = policy.tokenizer.eos_token_id, policy.tokenizer.pad_token_id
    ids = torch.tensor([[5, 6, eos, pad, pad], [5, 6, 7, 8, 9], [5, pad, 7, eos, pad]])
    mask, truncated = policy._completion_mask(ids)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]  # a sampled pad is a token
    assert truncated.tolist() == [False, True, False]


def test_stop_strings_end_the_completion():
    p = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=6, stop_strings=["</a>"]))
    ids = torch.tensor([p.tokenizer("x</a>y", add_special_tokens=False)["input_ids"],
                        p.tokenizer("abcdef", add_special_tokens=False)["input_ids"]])
    mask, truncated = p._completion_mask(ids)
    assert mask.tolist() == [[1, 1, 1, 1, 1, 0], [1] * 6]
    assert truncated.tolist() == [False, True]
    r = p.rollout(["1+1="], 4, seeds=[0])
    for text in r.completions:
        assert "</a>" not in text[:-4]  # generation stops at the first stop string


def test_supervised_loss_decreases(policy):
    rows = [{"prompt": "1+1=", "target": "<answer>2</answer>"}] * 4
    model = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char")).model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(15):
        loss = policy.supervised_loss(model, rows, "target")
        first = first if first is not None else loss.item()
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < 0.5 * first


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="policy.model"):
        CausalLMPolicy(CausalLMConfig())
    with pytest.raises(ValueError, match="policy.temperature"):
        CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", temperature=0))


def test_selective_log_softmax_of_a_position_slice_copies_no_whole_logits():
    """The training forward's logits are a slice of the model's output (`logits[:, P - 1:-1]`):
    the same values and gradient as from a contiguous copy, and no operation of the forward makes a
    tensor of the slice's size (the blocks are views)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sizes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:  # not a view
                    self.largest = max(self.largest, t.numel())
            return out

    torch.manual_seed(0)
    output = torch.randn(3, 9, 50, requires_grad=True)
    targets = torch.randint(0, 50, (3, 6))
    sliced = output[:, 2:-1]
    assert not sliced.is_contiguous()
    sizes = Sizes()
    with sizes:
        logp, ent = selective_log_softmax(sliced, targets, chunk_rows=4, with_entropy=True)
    assert sizes.largest <= 4 * 50  # one block at a time, never the slice's 3 x 6 x 50
    ref_logp, ref_ent = selective_log_softmax(sliced.contiguous(), targets, chunk_rows=4, with_entropy=True)
    assert torch.equal(logp, ref_logp) and torch.equal(ent, ref_ent)
    w = torch.randn(3, 6)
    g, = torch.autograd.grad((logp * w).sum(), output)
    g_ref, = torch.autograd.grad((torch.log_softmax(sliced, -1).gather(-1, targets[..., None]).squeeze(-1) * w).sum(),
                                 output)
    assert torch.allclose(g, g_ref, atol=1e-6)
