"""Log-probs of chosen tokens without materialising fp32 log-softmax for the whole batch.

log p(y) = z_y - logsumexp(z) computed in fp32 one chunk of rows at a time; the backward
recomputes softmax per chunk (d logp / d z = onehot(y) - softmax(z)), so only the logits in the
model's dtype and one fp32 log-normaliser per token are kept between forward and backward.
Entropy H = logsumexp(z) - sum softmax(z) z comes from the same pass, without grad.
"""

from __future__ import annotations

import torch
from torch import Tensor


class _SelectiveLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, chunk_rows: int, want_entropy: bool):
        flat = logits.reshape(-1, logits.shape[-1])
        tgt = targets.reshape(-1)
        lse = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
        chosen = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if want_entropy else None
        for start in range(0, flat.shape[0], chunk_rows):
            block = flat[start:start + chunk_rows].float()
            block_lse = torch.logsumexp(block, dim=-1)
            lse[start:start + chunk_rows] = block_lse
            chosen[start:start + chunk_rows] = block.gather(1, tgt[start:start + chunk_rows, None]).squeeze(1)
            if want_entropy:
                probs = torch.exp(block - block_lse[:, None])
                entropy[start:start + chunk_rows] = block_lse - (probs * block).sum(-1)
        ctx.save_for_backward(logits, targets, lse)
        ctx.chunk_rows = chunk_rows
        logp = (chosen - lse).view(targets.shape)
        ent = entropy.view(targets.shape) if want_entropy else torch.zeros((), device=logits.device)
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_entropy: Tensor):
        logits, targets, lse = ctx.saved_tensors
        flat = logits.reshape(-1, logits.shape[-1])
        tgt = targets.reshape(-1)
        g = grad_logp.reshape(-1).float()
        grad = torch.empty_like(flat)
        step = ctx.chunk_rows
        for start in range(0, flat.shape[0], step):
            block = flat[start:start + step].float()
            gb = g[start:start + step, None]
            block_grad = -torch.exp(block - lse[start:start + step, None]) * gb
            block_grad.scatter_add_(1, tgt[start:start + step, None], gb)
            grad[start:start + step] = block_grad.to(grad.dtype)
        return grad.view_as(logits), None, None, None


def selective_log_softmax(logits: Tensor, targets: Tensor, chunk_rows: int = 1024,
                          with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """fp32 log p(targets) of logits [..., V] (and the entropy of each distribution if asked)."""
    logp, ent = _SelectiveLogSoftmax.apply(logits, targets, chunk_rows, with_entropy)
    return logp, (ent if with_entropy else None)
