"""Codec frames as action units: the log-prob of a frame of codebook tokens, drawn and scored.

A speech model over a residual codec (CSM over Mimi) writes one *frame* per audio step: K codebook
tokens, the first from the backbone's head at that position, codebooks 1..K-1 one after another by
a small depth decoder that reads the backbone's hidden state and the frame's earlier codebooks.
One unit is one frame, and its log-prob is the exact chain rule over its codebooks:

    log pi(frame_t) = log p(c_0 | h_t) + sum_{k=1}^{K-1} log p(c_k | h_t, c_0 .. c_{k-1})

each term an fp32 log-softmax at the sampling temperature, over the codebook's tokens that the
codec can decode (ids at or past `allowed` are never drawn), within top-k when `top_k` is set.
`draw_frame` samples a frame and records that log-prob; `frame_logprobs` recomputes it under grad
from the backbone's hidden states, as the training forward does.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import DynamicCache


def codebook_logits(logits: Tensor, temperature: float, top_k: int, allowed: int) -> Tensor:
    """fp32 logits [..., V] as the sampler draws from them: divided by `temperature`, ids >= `allowed`
    and (with `top_k` > 0) all but the k largest set to -inf."""
    logits = logits.float() / temperature
    if allowed < logits.shape[-1]:
        logits = logits.masked_fill(torch.arange(logits.shape[-1], device=logits.device) >= allowed, float("-inf"))
    if 0 < top_k < allowed:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def _draw(logits: Tensor, generator: torch.Generator | None, greedy: bool) -> tuple[Tensor, Tensor]:
    """(token [B], its log-prob [B]) from sampler logits [B, V]."""
    logp = torch.log_softmax(logits, dim=-1)
    if greedy:
        token = logits.argmax(-1)
    else:
        token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return token, logp.gather(-1, token[:, None]).squeeze(-1)


@torch.no_grad()
def draw_frame(head: nn.Module, depth_decoder: nn.Module, hidden: Tensor, num_codebooks: int,
               temperature: float, top_k: int, allowed: int, generator: torch.Generator | None = None,
               greedy: bool = False) -> tuple[Tensor, Tensor]:
    """One frame for each row from the backbone's last hidden states `hidden` [B, H]: (codes [B, K],
    log-prob of the frame [B], fp32), codebook 0 from `head`, the others from `depth_decoder` with a
    KV cache (the input at its position 0 is `hidden`, as transformers' CSM generation gives it)."""
    token, logp = _draw(codebook_logits(head(hidden), temperature, top_k, allowed), generator, greedy)
    codes = [token]
    cache = DynamicCache(config=depth_decoder.config)
    step_ids = nn.functional.pad(token[:, None], (1, 0), value=0)
    for k in range(1, num_codebooks):
        out = depth_decoder(input_ids=step_ids, backbone_last_hidden_state=hidden if k == 1 else None,
                            cache=cache, use_cache=True, logits_to_keep=1)
        token, step_logp = _draw(codebook_logits(out.logits[:, -1], temperature, top_k, allowed), generator, greedy)
        codes.append(token)
        logp = logp + step_logp
        cache, step_ids = out.cache, token[:, None]
    return torch.stack(codes, dim=1), logp


def frame_logprobs(head: nn.Module, depth_decoder: nn.Module, hidden: Tensor, frames: Tensor,
                   temperature: float, top_k: int, allowed: int,
                   with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, T] (fp32, under grad) of frames [B, T, K] whose backbone hidden states (at the
    position before each frame) are `hidden` [B, T, H]; with `with_entropy`, each frame's entropy
    estimate [B, T]: the sum over its codebooks of the conditional entropies at the drawn prefix
    (an unbiased estimate of the frame's joint entropy)."""
    batch, length, codebooks = frames.shape
    flat_hidden = hidden.reshape(batch * length, -1)
    flat_frames = frames.reshape(batch * length, codebooks)
    logits = [codebook_logits(head(flat_hidden), temperature, top_k, allowed)]
    if codebooks > 1:  # position 0 is a placeholder the decoder replaces with the hidden state
        depth_ids = nn.functional.pad(flat_frames[:, :-1], (1, 0), value=0)
        depth = depth_decoder(input_ids=depth_ids, backbone_last_hidden_state=flat_hidden).logits
        logits.append(codebook_logits(depth, temperature, top_k, allowed))
    logp_all = torch.log_softmax(torch.cat([logits[0][:, None], *logits[1:]], dim=1), dim=-1)  # [BT, K, V]
    logp = logp_all.gather(-1, flat_frames[..., None]).squeeze(-1).sum(-1).reshape(batch, length)
    if not with_entropy:
        return logp, None
    probs = logp_all.exp()
    entropy = -(probs * logp_all.masked_fill(probs == 0, 0.0)).sum(-1).sum(-1)
    return logp, entropy.reshape(batch, length)
