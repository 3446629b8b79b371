"""Log-probs from hidden states (`hidden_state_logprobs`) against the plain computation: the whole
logits, then log_softmax in fp32; values, entropies and gradients, and the memory it never takes."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from mmrl.tasks.lm.hidden_logprobs import hidden_state_logprobs

N, H, V = 37, 16, 101


def plain(hidden, weight, bias, targets, temperature, banned=None):
    """The whole logits in the inputs' dtype, then fp32 log_softmax (what the adapters did)."""
    z = F.linear(hidden, weight, bias).float() / temperature
    if banned is not None:
        z = z.index_fill(-1, banned, torch.finfo(torch.float32).min)
    logp_all = torch.log_softmax(z, -1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def inputs(dtype, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=g) / H ** 0.5).to(dtype).requires_grad_()
    b = (torch.randn(V, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(0, V, (N,), generator=g)
    return hidden, weight, b, targets


def grads(logp, entropy, params, seed=1):
    """Gradients of a loss that weighs both the log-probs and the entropies."""
    g = torch.Generator().manual_seed(seed)
    loss = (logp * torch.randn(N, generator=g)).sum() - 0.3 * (entropy * torch.randn(N, generator=g)).sum()
    return torch.autograd.grad(loss, [p for p in params if p is not None])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fp32_logprobs_entropy_and_gradients_equal_the_plain_computation(temperature):
    hidden, weight, bias, targets = inputs(torch.float32)
    logp, ent = hidden_state_logprobs(hidden, weight, targets, bias, temperature, chunk_tokens=8, with_entropy=True)
    ref, ref_ent = plain(hidden, weight, bias, targets, temperature)
    assert (logp - ref).abs().max() <= 1e-5 and (ent - ref_ent).abs().max() <= 1e-5
    for got, want in zip(grads(logp, ent, [hidden, weight, bias]), grads(ref, ref_ent, [hidden, weight, bias])):
        assert (got - want).abs().max() <= 1e-4


def test_bf16_inputs_give_the_plain_computation_of_bf16_logits():
    hidden, weight, bias, targets = inputs(torch.bfloat16)
    logp, ent = hidden_state_logprobs(hidden, weight, targets, bias, 0.7, chunk_tokens=5, with_entropy=True)
    ref, ref_ent = plain(hidden, weight, bias, targets, 0.7)
    assert logp.dtype == torch.float32
    assert (logp - ref).abs().max() <= 1e-5 and (ent - ref_ent).abs().max() <= 1e-5
    for got, want in zip(grads(logp, ent, [hidden, weight, bias]), grads(ref, ref_ent, [hidden, weight, bias])):
        assert got.dtype == torch.bfloat16
        assert (got.float() - want.float()).abs().max() <= 2e-2 * want.float().abs().max()


def test_tied_embeddings_get_the_gradient_of_both_uses():
    torch.manual_seed(0)
    embed = torch.nn.Embedding(V, H)
    ids = torch.randint(0, V, (N,))
    targets = torch.randint(0, V, (N,))

    def run(fused):
        embed.zero_grad()
        hidden = torch.tanh(embed(ids))
        if fused:
            logp, _ = hidden_state_logprobs(hidden, embed.weight, targets, chunk_tokens=6)
        else:
            logp, _ = plain(hidden, embed.weight, None, targets, 1.0)
        logp.sum().backward()
        return logp.detach(), embed.weight.grad.clone()

    (logp, grad), (ref, ref_grad) = run(True), run(False)
    assert (logp - ref).abs().max() <= 1e-5 and (grad - ref_grad).abs().max() <= 1e-4


def test_banned_tokens_have_no_probability_and_no_gradient():
    hidden, weight, bias, targets = inputs(torch.float32)
    banned = torch.tensor([3, 50])
    targets = torch.where(torch.isin(targets, banned), 0, targets)
    logp, ent = hidden_state_logprobs(hidden, weight, targets, bias, 1.3, 7, True, banned)
    ref, ref_ent = plain(hidden, weight, bias, targets, 1.3, banned)
    assert (logp - ref).abs().max() <= 1e-5 and (ent - ref_ent).abs().max() <= 1e-5
    grad_weight, = torch.autograd.grad(logp.sum() + ent.sum(), weight)
    assert grad_weight[banned].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frozen_projection_gets_no_gradient_and_3d_hidden_states_keep_their_shape(dtype):
    """A frozen head: no gradient of the weight is computed; the same gradients of the hidden states."""
    hidden, weight, bias, targets = inputs(dtype)
    frozen, frozen_bias = weight.detach(), bias.detach()
    logp, ent = hidden_state_logprobs(hidden.view(1, N, H), frozen, targets.view(1, N), frozen_bias, 0.7,
                                      chunk_tokens=4, with_entropy=True, banned=torch.tensor([5]))
    assert logp.shape == (1, N) and ent.shape == (1, N)
    grad, = grads(logp.view(N), ent.view(N), [hidden])
    ref, ref_ent = plain(hidden, frozen, frozen_bias, targets, 0.7, torch.tensor([5]))
    ref_grad, = grads(ref, ref_ent, [hidden])
    assert (logp.view(N) - ref).abs().max() <= 1e-5
    assert (grad.float() - ref_grad.float()).abs().max() <= (1e-4 if dtype == torch.float32
                                                             else 2e-2 * ref_grad.float().abs().max())


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operation returns while the mode is on."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_at_most_one_chunk_of_logits_exists_in_the_forward_and_the_backward():
    n, chunk = 200, 50  # chunk * V above every other tensor (n * H, V * H)
    hidden = torch.randn(n, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    targets = torch.randint(0, V, (n,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        with LargestTensor() as forward:
            logp, ent = hidden_state_logprobs(hidden, weight, targets, chunk_tokens=chunk, with_entropy=True)
    with LargestTensor() as backward:
        (logp.sum() + ent.sum()).backward()
    assert forward.largest == chunk * V and backward.largest == chunk * V  # never n * V
    assert max(saved) == max(n * H, V * H)  # the inputs themselves; no logits are kept for the backward
    with LargestTensor() as whole:
        ref, ref_ent = plain(hidden, weight, None, targets, 1.0)
        (ref.sum() + ref_ent.sum()).backward()
    assert whole.largest == n * V  # the probe sees the plain computation's whole logits


class LogitProducts(TorchDispatchMode):
    """How many matrix products return a chunk of logits (a tensor whose last dimension is V)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm) and out.shape[-1] == V:
            self.count += 1
        return out


@pytest.mark.parametrize("with_entropy", [False, True])
def test_a_frozen_projection_projects_each_chunk_once_in_forward_and_backward(with_entropy):
    """With the head frozen the hidden states' gradients come from the forward's logits: one logit
    product per chunk in all (a trained head's backward recomputes them: two), same gradients."""
    hidden, weight, bias, targets = inputs(torch.float32)
    chunks = -(-N // 8)
    for frozen, products in ((True, chunks), (False, 2 * chunks)):
        w, b = (weight.detach(), bias.detach()) if frozen else (weight, bias)
        with LogitProducts() as counted:
            logp, ent = hidden_state_logprobs(hidden, w, targets, b, 0.7, chunk_tokens=8, with_entropy=with_entropy)
            got = grads(logp, ent if with_entropy else torch.zeros(N), [hidden])[0]
        assert counted.count == products
        ref, ref_ent = plain(hidden, w, b, targets, 0.7)
        want = grads(ref, ref_ent if with_entropy else torch.zeros(N), [hidden])[0]
        assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("with_entropy", [False, True])
def test_a_trained_projection_holds_one_chunk_of_logits_at_a_time(monkeypatch, with_entropy):
    """The allocation probe (scripts/memory_probe.py: the profiler's allocation events) over the forward
    and backward of a trained projection: one chunk of fp32 logits [chunk, V], the gradients of h and
    W, and a few sub-blocks of element-wise temporaries, never a second chunk-sized buffer (the copy of
    the projection's output, the exponentials, the softmax's gradient: three before)."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    from memory_probe import peak_bytes
    from mmrl.tasks.lm import token_logprobs
    n, hidden_size, vocab, chunk, sub_rows = 256, 16, 4096, 128, 8
    monkeypatch.setattr(token_logprobs, "SUB_BLOCK_ELEMENTS", sub_rows * vocab)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, hidden_size, generator=g, requires_grad=True)
    weight = (torch.randn(vocab, hidden_size, generator=g) / 4).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=g)

    def forward_backward():
        logp, ent = hidden_state_logprobs(hidden, weight, targets, chunk_tokens=chunk, with_entropy=with_entropy)
        (logp.sum() + (ent.sum() if with_entropy else 0)).backward()

    forward_backward()  # the gradients exist: the probed pass accumulates into them
    peak = peak_bytes(forward_backward)
    chunk_bytes = chunk * vocab * 4
    gradients = 4 * (n * hidden_size + vocab * hidden_size)  # the backward's dh and dW before they accumulate
    small = 4 * sub_rows * vocab * 3 + 64 * n * 4  # sub-block temporaries, per-token vectors
    assert chunk_bytes <= peak <= chunk_bytes + gradients + small
