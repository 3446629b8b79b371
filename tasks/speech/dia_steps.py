"""Dia's decoder steps as action units: the scores its stock sampler draws from, and a step's log-prob.

Dia's decoder writes one *step* of all K codebooks (channels) at a time, channel k delayed by
``delay_pattern[k]`` frames, every channel drawn independently from the logits at the previous
position. A step's scores are those of transformers' Dia generation, in its order: classifier-free
guidance (`DiaClassifierFreeGuidanceLogitsProcessor`: conditional + scale x (conditional -
unconditional), and with top-k the conditional logits kept within the top-k of that guided sum),
temperature, the end-of-speech filter (`DiaEOSChannelFilterLogitsProcessor`: ids at or past the eos id
refused on channels 1..K-1 and past it on channel 0; channel 0 ends exactly when eos is its highest
score), top-k, top-p. A step's log-prob is the sum over the channels drawn there (`free`) of the fp32
log-softmax of those scores:

    log pi(step_t) = sum_{k free at t} log p_k(x_{t,k} | text, x_{<t})

Channels the delay pattern fixes (the bos / prompt positions, the eos a channel writes ``delay``
steps after channel 0's, the padding after it) are not drawn and take no part. Channel 0's end
decision is the argmax rule above, so its eos has probability 1 where it is drawn and none elsewhere;
`step_scores` applies that decision as drawn (`ends`) when scoring a recorded step, which is the
stock rule at the sampler's own weights and keeps the recorded tokens finite at others.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from transformers.generation.logits_process import DiaClassifierFreeGuidanceLogitsProcessor


def end_filter(scores: Tensor, eos: int, ends: Tensor | None) -> tuple[Tensor, Tensor]:
    """Scores [N, K, V] with Dia's end-of-speech filter, and channel 0's end decision [N]: `ends` as
    recorded, or (None) eos being channel 0's highest score, as the stock processor decides."""
    ids = torch.arange(scores.shape[-1], device=scores.device)
    scores = scores.clone()
    scores[:, 1:] = scores[:, 1:].masked_fill(ids >= eos, float("-inf"))
    scores[:, 0] = scores[:, 0].masked_fill(ids > eos, float("-inf"))
    if ends is None:
        ends = scores[:, 0].argmax(-1) == eos
    keep = torch.where(ends[:, None], ids == eos, ids != eos)
    scores[:, 0] = scores[:, 0].masked_fill(~keep, float("-inf"))
    return scores, ends


def step_scores(cond: Tensor, uncond: Tensor | None, eos: int, guidance_scale: float, temperature: float,
                top_k: int, top_p: float, ends: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """fp32 scores [N, K, V] of steps from the conditional (and, with guidance, unconditional) logits
    [N, K, V], as Dia's generation processes them (module docstring), and channel 0's end decisions [N]."""
    n, k, v = cond.shape
    cond = cond.float().reshape(n * k, v)
    if guidance_scale != 1:
        guidance = DiaClassifierFreeGuidanceLogitsProcessor(guidance_scale, top_k if top_k > 0 else None)
        scores = guidance(cond.new_empty(n * k, 0, dtype=torch.long), torch.cat([cond, uncond.float().reshape(n * k, v)]))
    else:
        scores = cond
    if temperature != 1:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    scores, ends = end_filter(scores.reshape(n, k, v), eos, ends)
    scores = scores.reshape(n * k, v)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.reshape(n, k, v), ends


def step_logprobs(scores: Tensor, tokens: Tensor, free: Tensor,
                  with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """Log-probs [N] of steps `tokens` [N, K] under `scores` [N, K, V]: the sum over the `free` [N, K]
    channels; with `with_entropy`, the sum of those channels' entropies [N]."""
    logp_all = torch.log_softmax(scores, dim=-1)
    logp = logp_all.gather(-1, tokens[..., None]).squeeze(-1)
    total = torch.where(free, logp, torch.zeros_like(logp)).sum(-1)
    if not with_entropy:
        return total, None
    probs = logp_all.exp()
    entropy = -(probs * logp_all.masked_fill(probs == 0, 0.0)).sum(-1)
    return total, torch.where(free, entropy, torch.zeros_like(entropy)).sum(-1)
