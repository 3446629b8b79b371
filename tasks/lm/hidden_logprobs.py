"""Token log-probs straight from the final hidden states, the logits never whole.

For hidden states h [N, H], the output projection W [V, H] (bias b [V]) and a temperature T, the
logits of a token are z = (h W^T + b) / T; log p(y) = z_y - logsumexp(z) and the entropy
H = logsumexp(z) - sum softmax(z) z. The tokens are processed a chunk at a time: the forward
keeps one fp32 log-normaliser (and entropy) per token, and the backward recomputes each chunk's
logits to accumulate the gradients of h, W and b, so at most one chunk of logits [n, V] exists at
a time in either pass. The projection runs in the inputs' dtype (as the model's head does), the
softmax in fp32; the gradients of W and b accumulate in their own dtype, one chunk at a time.

The entropy is differentiable: dH/dz_j = -p_j (log p_j + H), so an entropy bonus trains.
`banned` token ids get the lowest fp32 value (probability 0, no gradient), as the sampler bans them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .token_logprobs import block_grad, block_stats, scaled_block


def chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float,
                 banned: Tensor | None) -> Tensor:
    """fp32 logits [n, V] of one chunk of hidden states [n, H] (`scaled_block` of the projection)."""
    return scaled_block(F.linear(hidden, weight, bias), temperature, banned)


class _HiddenStateLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float,
                chunk_tokens: int, want_entropy: bool, banned: Tensor | None):
        n = hidden.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        logp = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if want_entropy else torch.zeros((), device=hidden.device)
        for start in range(0, n, chunk_tokens):
            end = min(start + chunk_tokens, n)
            z = chunk_logits(hidden[start:end], weight, bias, temperature, banned)
            lse[start:end], logp[start:end], chunk_entropy = block_stats(z, targets[start:end], want_entropy)
            if want_entropy:
                entropy[start:end] = chunk_entropy
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy if want_entropy else None, banned)
        ctx.temperature, ctx.chunk_tokens = temperature, chunk_tokens
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_entropy: Tensor | None):
        hidden, weight, bias, targets, lse, entropy, banned = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(bias) if need_bias else None
        g_logp = grad_logp.float()
        g_entropy = grad_entropy.float() if entropy is not None and grad_entropy is not None else None
        for start in range(0, hidden.shape[0], ctx.chunk_tokens):
            end = min(start + ctx.chunk_tokens, hidden.shape[0])
            dz = block_grad(chunk_logits(hidden[start:end], weight, bias, ctx.temperature, banned),
                            lse[start:end], targets[start:end], g_logp[start:end],
                            None if g_entropy is None else (entropy[start:end], g_entropy[start:end]),
                            ctx.temperature, banned).to(hidden.dtype)
            if need_hidden:
                torch.matmul(dz, weight.to(hidden.dtype), out=grad_hidden[start:end])
            if need_weight:
                grad_weight.addmm_(dz.t().to(weight.dtype), hidden[start:end].to(weight.dtype))
            if need_bias:
                grad_bias.add_(dz.sum(0).to(bias.dtype))
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def hidden_state_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None,
                          temperature: float = 1.0, chunk_tokens: int = 1024, with_entropy: bool = False,
                          banned: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """fp32 log p(targets) [...] of hidden states [..., H] through the projection `weight` [V, H]
    (+ `bias` [V]) at `temperature`, and the entropy of each distribution if asked; at most
    `chunk_tokens` tokens' logits exist at a time."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be at least 1")
    shape = targets.shape
    flat = hidden.reshape(-1, hidden.shape[-1])
    logp, entropy = _HiddenStateLogProbs.apply(flat, weight, bias, targets.reshape(-1).to(flat.device),
                                               float(temperature), int(chunk_tokens), with_entropy, banned)
    return logp.view(shape), (entropy.view(shape) if with_entropy else None)
