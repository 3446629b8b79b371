"""Log-probs of chosen tokens without materialising fp32 log-softmax for the whole batch.

log p(y) = z_y - logsumexp(z) computed in fp32 one block of rows at a time; the backward
recomputes softmax per block (d logp / d z = onehot(y) - softmax(z)), so only the logits in the
model's dtype and one fp32 log-normaliser per token are kept between forward and backward.
Entropy H = logsumexp(z) - sum softmax(z) z comes from the same pass, with its gradient
dH/dz_j = -p_j (log p_j + H) (an entropy bonus trains).

The blocks are views of the logits, also where the logits are a slice of the model's output
(`logits[:, P - 1:-1]`, not viewable as one [rows, V] matrix): such a slice is never copied whole.
Inside a block, the element-wise work (exponentials, the softmax's gradient) runs on a few rows at
a time (`SUB_BLOCK_ELEMENTS` logits), in place where it can: a block of fp32 logits is the only
block-sized buffer a forward or a backward holds (`hidden_logprobs.py` relies on it).
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


SUB_BLOCK_ELEMENTS = 1 << 22  # logits per piece of element-wise work (16 MiB of fp32): its temporaries' size


def sub_blocks(rows: int, vocab: int) -> Iterator[slice]:
    """Consecutive slices of a block's `rows` rows, each at most `SUB_BLOCK_ELEMENTS` logits (one row at least)."""
    step = max(1, SUB_BLOCK_ELEMENTS // max(vocab, 1))
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


def scaled_block(raw: Tensor, temperature: float, banned: Tensor | None, in_place: bool = False) -> Tensor:
    """fp32 logits [n, V] of a block of raw logits, divided by the temperature, the banned ids at the
    lowest fp32 value (probability 0, no gradient) as the sampler bans them: a new tensor, or with
    `in_place` `raw` itself where it is fp32 already (a projection's fresh output, nothing else reads it)."""
    z = raw if in_place and raw.dtype == torch.float32 else raw.to(torch.float32, copy=True)
    if temperature != 1.0:
        z.div_(temperature)
    if banned is not None:
        z.index_fill_(1, banned, torch.finfo(torch.float32).min)
    return z


def block_stats(z: Tensor, targets: Tensor, want_entropy: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """(log-normaliser, log p(targets), entropy or None) [n] of a block of fp32 logits z [n, V], left
    as it was; the temporaries are a sub-block's (`sub_blocks`)."""
    lse = torch.empty(z.shape[0], dtype=torch.float32, device=z.device)
    logp = torch.empty_like(lse)
    entropy = torch.empty_like(lse) if want_entropy else None
    for rows in sub_blocks(z.shape[0], z.shape[1]):
        zs = z[rows]
        lse[rows] = part_lse = torch.logsumexp(zs, dim=-1)
        logp[rows] = zs.gather(1, targets[rows, None]).squeeze(1) - part_lse
        if want_entropy:
            log_p = zs - part_lse[:, None]
            entropy[rows] = -log_p.exp().mul_(log_p).sum(-1)
    return lse, logp, entropy


def block_grad(z: Tensor, lse: Tensor, targets: Tensor, g_logp: Tensor,
               entropy_grad: tuple[Tensor, Tensor] | None, temperature: float, banned: Tensor | None) -> Tensor:
    """d loss / d raw logits [n, V] in fp32, in z's memory (z, the block's fp32 logits, is overwritten
    and returned): (g_logp (onehot(y) - p) - g_H p (log p + H)) / T, 0 at the banned ids."""
    for rows in sub_blocks(z.shape[0], z.shape[1]):
        log_p = z[rows].sub_(lse[rows, None])
        g = g_logp[rows, None]
        if entropy_grad is None:  # in place throughout: -g p, then + g at the target
            dz = log_p.exp_().mul_(-g)
        else:
            entropy, g_entropy = entropy_grad
            p = log_p.exp()
            from_entropy = log_p.add_(entropy[rows, None]).mul_(p).mul_(g_entropy[rows, None])  # in z's memory
            dz = from_entropy.neg_().sub_(p.mul_(g))  # -g_H p (log p + H) - g p
        dz.scatter_add_(1, targets[rows, None], g)
    if banned is not None:
        z.index_fill_(1, banned, 0.0)
    return z.div_(temperature) if temperature != 1.0 else z


class _SelectiveLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, chunk_rows: int, want_entropy: bool, temperature: float,
                banned: Tensor | None):
        tgt = targets.reshape(-1)
        lse = torch.empty(tgt.shape[0], dtype=torch.float32, device=logits.device)
        logp = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if want_entropy else None
        for start, rows in row_blocks(logits, chunk_rows):
            end = start + rows.shape[0]
            block_lse, block_logp, block_entropy = block_stats(scaled_block(rows, temperature, banned),
                                                               tgt[start:end], want_entropy)
            lse[start:end], logp[start:end] = block_lse, block_logp
            if want_entropy:
                entropy[start:end] = block_entropy
        ctx.save_for_backward(logits, targets, lse, entropy, banned)
        ctx.chunk_rows, ctx.temperature = chunk_rows, temperature
        ent = entropy.view(targets.shape) if want_entropy else torch.zeros((), device=logits.device)
        return logp.view(targets.shape), ent

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_entropy: Tensor):
        logits, targets, lse, entropy, banned = ctx.saved_tensors
        tgt = targets.reshape(-1)
        g = grad_logp.reshape(-1).float()
        g_entropy = grad_entropy.reshape(-1).float() if entropy is not None else None
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # dense, whatever the input's layout
        grad_rows = grad.view(-1, logits.shape[-1])
        for start, rows in row_blocks(logits, ctx.chunk_rows):
            end = start + rows.shape[0]
            grad_rows[start:end] = block_grad(scaled_block(rows, ctx.temperature, banned), lse[start:end], tgt[start:end], g[start:end],
                                              None if entropy is None else (entropy[start:end], g_entropy[start:end]),
                                              ctx.temperature, banned)
        return grad, None, None, None, None, None


def selective_log_softmax(logits: Tensor, targets: Tensor, chunk_rows: int = 1024, with_entropy: bool = False,
                          temperature: float = 1.0, banned: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """fp32 log p(targets) of logits [..., V] divided by `temperature` in fp32, the `banned` ids at
    probability 0 (and the entropy of each distribution if asked)."""
    logp, ent = _SelectiveLogSoftmax.apply(logits, targets, chunk_rows, with_entropy, float(temperature), banned)
    return logp, (ent if with_entropy else None)
