"""Token log-probs straight from the final hidden states, the logits never whole.

For hidden states h [N, H], the output projection W [V, H] (bias b [V]) and a temperature T, the
logits of a token are z = (h W^T + b) / T; log p(y) = z_y - logsumexp(z) and the entropy
H = logsumexp(z) - sum softmax(z) z. The tokens are processed a chunk at a time: the forward
keeps one fp32 log-normaliser (and entropy) per token, and the backward recomputes each chunk's
logits to accumulate the gradients of h, W and b, so at most one chunk of fp32 logits [n, V] exists
at a time in either pass (the softmax's element-wise work runs in it, a few rows at a time:
`token_logprobs.sub_blocks`; a frozen projection's forward with the entropy holds a second one, its
gradient's). The projection runs in the inputs' dtype (as the model's head does), the
softmax in fp32; the gradients of W and b accumulate in their own dtype, one chunk at a time.

Sharded parameters (under a strategy that shards them: `ParallelView.whole`) are gathered whole
for the forward and again for the backward, and freed in between; the backward's gradients of W
and b are reduced into their shards (`ParallelView.whole_gradient`) as the strategy reduces its
modules'. A gathered fp32 master weight projects in the hidden states' (compute) dtype, as the
sharded model's head would.

A frozen projection (LoRA on the other layers, a frozen head): only the hidden states take a
gradient, and d log p(y) / dh and dH / dh [N, H] do not depend on the loss above them, so the
forward computes them with each chunk's logits and the backward only scales them by the upstream
gradients: one projection of logits in all, where the recomputing backward would take a second.

The entropy is differentiable: dH/dz_j = -p_j (log p_j + H), so an entropy bonus trains.
`banned` token ids get the lowest fp32 value (probability 0, no gradient), as the sampler bans them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from mmrl.core.parallel import ParallelView

from .token_logprobs import block_grad, block_stats, scaled_block


def chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float,
                 banned: Tensor | None) -> Tensor:
    """fp32 logits [n, V] of one chunk of hidden states [n, H] (`scaled_block` of the projection, scaled
    in the projection's own memory where it is fp32: one chunk-sized buffer)."""
    return scaled_block(F.linear(hidden, weight, bias), temperature, banned, in_place=True)


class _HiddenStateLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                chunk_tokens: int, want_entropy: bool, banned: Tensor | None, parallel: ParallelView):
        n = hidden.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        logp = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if want_entropy else torch.zeros((), device=hidden.device)
        frozen_projection = ctx.needs_input_grad[0] and not any(ctx.needs_input_grad[1:3])
        jacobians = (torch.empty_like(hidden), torch.empty_like(hidden) if want_entropy else None) \
            if frozen_projection else None
        with whole_projection(parallel, weight, bias) as (whole_weight, whole_bias):
            w, b = projection(whole_weight, whole_bias, hidden.dtype)
            for start in range(0, n, chunk_tokens):
                end = min(start + chunk_tokens, n)
                z = chunk_logits(hidden[start:end], w, b, temperature, banned)
                lse[start:end], logp[start:end], chunk_entropy = block_stats(z, targets[start:end], want_entropy)
                if want_entropy:
                    entropy[start:end] = chunk_entropy
                if frozen_projection:
                    hidden_jacobians(z, lse[start:end], targets[start:end],
                                     entropy[start:end] if want_entropy else None, w, temperature, banned,
                                     [None if j is None else j[start:end] for j in jacobians])
                z = None  # freed before the next chunk's logits: one chunk-sized buffer at a time
        if frozen_projection:
            ctx.save_for_backward(*jacobians)
        else:
            ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy if want_entropy else None, banned)
        ctx.frozen_projection = frozen_projection
        ctx.temperature, ctx.chunk_tokens, ctx.parallel = temperature, chunk_tokens, parallel
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_entropy: Tensor | None):
        if ctx.frozen_projection:
            jacobian_logp, jacobian_entropy = ctx.saved_tensors
            grad = jacobian_logp.float() * grad_logp.float()[:, None]
            if jacobian_entropy is not None and grad_entropy is not None:
                grad.add_(jacobian_entropy.float() * grad_entropy.float()[:, None])
            return grad.to(jacobian_logp.dtype), None, None, None, None, None, None, None, None
        hidden, weight, bias, targets, lse, entropy, banned = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        parallel = ctx.parallel
        g_logp = grad_logp.float()
        g_entropy = grad_entropy.float() if entropy is not None and grad_entropy is not None else None
        with whole_projection(parallel, weight, bias) as (whole_weight, whole_bias):
            w, b = projection(whole_weight, whole_bias, hidden.dtype)
            grad_hidden = torch.empty_like(hidden) if need_hidden else None
            grad_weight = torch.zeros_like(whole_weight) if need_weight else None
            grad_bias = torch.zeros_like(whole_bias) if need_bias else None
            for start in range(0, hidden.shape[0], ctx.chunk_tokens):
                end = min(start + ctx.chunk_tokens, hidden.shape[0])
                dz = block_grad(chunk_logits(hidden[start:end], w, b, ctx.temperature, banned),
                                lse[start:end], targets[start:end], g_logp[start:end],
                                None if g_entropy is None else (entropy[start:end], g_entropy[start:end]),
                                ctx.temperature, banned).to(hidden.dtype)
                if need_hidden:
                    torch.matmul(dz, w, out=grad_hidden[start:end])
                if need_weight:
                    grad_weight.addmm_(dz.t().to(grad_weight.dtype), hidden[start:end].to(grad_weight.dtype))
                if need_bias:
                    grad_bias.add_(dz.sum(0).to(grad_bias.dtype))
                dz = None  # freed before the next chunk's logits: one chunk-sized buffer at a time
        if need_weight:
            grad_weight = parallel.whole_gradient(weight, grad_weight)
        if need_bias:
            grad_bias = parallel.whole_gradient(bias, grad_bias)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


def hidden_jacobians(z: Tensor, lse: Tensor, targets: Tensor, entropy: Tensor | None, w: Tensor,
                     temperature: float, banned: Tensor | None, out: list[Tensor | None]) -> None:
    """d log p(y) / dh, and dH / dh where `entropy` is given, of one chunk into `out` [n, H]
    (z, the chunk's fp32 logits, is overwritten)."""
    ones = torch.ones_like(lse)
    if entropy is not None:
        d_entropy = block_grad(z.clone(), lse, targets, torch.zeros_like(lse), (entropy, ones), temperature, banned)
        torch.matmul(d_entropy.to(w.dtype), w, out=out[1])
    torch.matmul(block_grad(z, lse, targets, ones, None, temperature, banned).to(w.dtype), w, out=out[0])


@contextmanager
def whole_projection(parallel: ParallelView, weight: Tensor, bias: Tensor | None
                     ) -> Iterator[tuple[Tensor, Tensor | None]]:
    """The weight and bias whole (gathered where `parallel` shards them) while the block runs."""
    with parallel.whole(weight) as whole_weight:
        if bias is None:
            yield whole_weight, None
            return
        with parallel.whole(bias) as whole_bias:
            yield whole_weight, whole_bias


def projection(weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """The whole projection in the hidden states' dtype (a gathered fp32 shard's compute dtype)."""
    return weight.to(dtype), (bias.to(dtype) if bias is not None else None)


def hidden_state_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None,
                          temperature: float = 1.0, chunk_tokens: int = 1024, with_entropy: bool = False,
                          banned: Tensor | None = None, parallel: ParallelView | None = None
                          ) -> tuple[Tensor, Tensor | None]:
    """fp32 log p(targets) [...] of hidden states [..., H] through the projection `weight` [V, H]
    (+ `bias` [V]) at `temperature`, and the entropy of each distribution if asked; at most
    `chunk_tokens` tokens' logits exist at a time. Parameters sharded over the processes
    (`parallel`; None: whole) are gathered whole for the forward and again for the backward, whose gradients
    are reduced into their shards as the strategy reduces its modules'; every process must call it."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be at least 1")
    shape = targets.shape
    flat = hidden.reshape(-1, hidden.shape[-1])
    logp, entropy = _HiddenStateLogProbs.apply(flat, weight, bias, targets.reshape(-1).to(flat.device),
                                               float(temperature), int(chunk_tokens), with_entropy, banned,
                                               parallel or ParallelView())
    return logp.view(shape), (entropy.view(shape) if with_entropy else None)
