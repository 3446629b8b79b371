"""Log-probs of chosen tokens without materialising fp32 log-softmax for the whole batch.

log p(y) = z_y - logsumexp(z) computed in fp32 one block of rows at a time; the backward
recomputes softmax per block (d logp / d z = onehot(y) - softmax(z)), so only the logits in the
model's dtype and one fp32 log-normaliser per token are kept between forward and backward.
Entropy H = logsumexp(z) - sum softmax(z) z comes from the same pass, with its gradient
dH/dz_j = -p_j (log p_j + H) (an entropy bonus trains).

The blocks are views of the logits, also where the logits are a slice of the model's output
(`logits[:, P - 1:-1]`, not viewable as one [rows, V] matrix): such a slice is never copied whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor


def row_blocks(logits: Tensor, chunk_rows: int) -> Iterator[tuple[int, Tensor]]:
    """(first flat row, a [n, V] view of the logits) for blocks of at most `chunk_rows` rows, in
    row-major order over the leading dimensions. Views wherever each [T, V] matrix has dense rows
    (a slice along the positions included); any other layout is copied once."""
    vocab = logits.shape[-1]
    try:
        flat = logits.view(-1, vocab)
    except RuntimeError:
        flat = None
    if flat is None and logits.dim() >= 3 and logits.stride(-1) == 1:  # a slice along the positions
        per = logits.shape[-2]
        for index, matrix in enumerate(logits.reshape(-1, per, vocab)):
            for start in range(0, per, chunk_rows):
                yield index * per + start, matrix[start:start + chunk_rows]
        return
    flat = flat if flat is not None else logits.reshape(-1, vocab)
    for start in range(0, flat.shape[0], chunk_rows):
        yield start, flat[start:start + chunk_rows]


class _SelectiveLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, chunk_rows: int, want_entropy: bool):
        tgt = targets.reshape(-1)
        lse = torch.empty(tgt.shape[0], dtype=torch.float32, device=logits.device)
        chosen = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if want_entropy else None
        for start, rows in row_blocks(logits, chunk_rows):
            block = rows.float()
            end = start + block.shape[0]
            block_lse = torch.logsumexp(block, dim=-1)
            lse[start:end] = block_lse
            chosen[start:end] = block.gather(1, tgt[start:end, None]).squeeze(1)
            if want_entropy:
                probs = torch.exp(block - block_lse[:, None])
                entropy[start:end] = block_lse - (probs * block).sum(-1)
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.chunk_rows = chunk_rows
        logp = (chosen - lse).view(targets.shape)
        ent = entropy.view(targets.shape) if want_entropy else torch.zeros((), device=logits.device)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_entropy: Tensor):
        logits, targets, lse, entropy = ctx.saved_tensors
        tgt = targets.reshape(-1)
        g = grad_logp.reshape(-1).float()
        g_entropy = grad_entropy.reshape(-1).float() if entropy is not None else None
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # dense, whatever the input's layout
        grad_rows = grad.view(-1, logits.shape[-1])
        for start, rows in row_blocks(logits, ctx.chunk_rows):
            end = start + rows.shape[0]
            gb = g[start:end, None]
            log_p = rows.float() - lse[start:end, None]
            p = torch.exp(log_p)
            block_grad = -p * gb
            block_grad.scatter_add_(1, tgt[start:end, None], gb)
            if g_entropy is not None:
                block_grad -= log_p.add_(entropy[start:end, None]).mul_(p).mul_(g_entropy[start:end, None])
            grad_rows[start:end] = block_grad
        return grad, None, None, None


def selective_log_softmax(logits: Tensor, targets: Tensor, chunk_rows: int = 1024,
                          with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """fp32 log p(targets) of logits [..., V] (and the entropy of each distribution if asked)."""
    logp, ent = _SelectiveLogSoftmax.apply(logits, targets, chunk_rows, with_entropy)
    return logp, (ent if with_entropy else None)
