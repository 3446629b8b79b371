"""What Qwen2.5-Omni's talker reads and how its codec tokens are drawn: the frozen thinker's states of a reply
teacher-forced through it, the talker's input embeddings built from them as
`Qwen2_5OmniForConditionalGeneration.generate` builds them, and the logits processors its `talker.generate` applies.

The thinker reads the prompt and the reply's tokens but the last (its end token, which the stock generate draws and
never feeds back). From one forward with its hidden states:

    prefill  [L + 2, E]  (last hidden + input embedding) at the L prompt positions, the speaker's text-bos embedding,
                         and (last hidden + embedding) at the reply's first token
    stream   [R, E]      the same at the reply's 2nd .. (n-1)th token, then the embeddings of the talker's text-end
                         and text-pad tokens; the talker's input at code t >= 1 adds stream[min(t - 1, R - 1)]
                         (the stock generate shifts the stream by one a step and keeps its last entry at its end)

The talker's prefill also carries codec embeddings at its last two positions (codec pad, codec start) and none at
the L prompt positions (their codec ids are the mask token, which the stock forward never embeds); every later input
is the codec embedding of the code drawn before plus its stream entry. Its logits are those of `codec_head` in fp32,
then, in the stock `generate`'s order: the repetition penalty over every codec id the sequence holds so far (prefix
ids included), the codec start id suppressed, then (sampling) temperature, top-k and top-p.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn


@torch.no_grad()
def thinker_states(model: nn.Module, prompt_ids: Sequence[int], reply_ids: Sequence[int],
                   speaker_bos: int) -> tuple[Tensor, Tensor]:
    """(prefill [L + 2, E], stream [R, E]) of one prompt and its reply (module docstring), in the thinker's dtype."""
    thinker, talker = model.thinker, model.talker
    ids = torch.tensor([[*prompt_ids, *reply_ids[:-1]]], device=thinker.device)
    out = thinker(input_ids=ids, output_hidden_states=True, use_cache=False)
    states = (out.hidden_states[-1] + out.hidden_states[0])[0]  # [L + n - 1, E]
    embed = thinker.get_input_embeddings()
    special = embed(torch.tensor([speaker_bos, talker.text_eos_token, talker.text_pad_token], device=ids.device))
    length = len(prompt_ids)
    prefill = torch.cat([states[:length], special[:1], states[length:length + 1]])
    stream = torch.cat([states[length + 1:], special[1:]])
    return prefill, stream


def prefix_codes(talker: nn.Module, length: int) -> list[int]:
    """The talker's codec ids at its prefill of `length` positions: mask, ..., mask, codec pad, codec start."""
    return [talker.codec_mask_token] * (length - 2) + [talker.codec_pad_token, talker.codec_bos_token]


def prefill_embeds(talker: nn.Module, prefill: Tensor, codes: Tensor) -> Tensor:
    """The talker's input embeddings [B, L, E] at its prefill [B, L, E] whose codec ids are `codes` [B, L]: the codec
    embedding added where the id is not the mask token (nor padding: pass the mask id there)."""
    embedded = talker.get_input_embeddings()(codes) * (codes != talker.codec_mask_token)[..., None]
    return prefill.to(embedded.dtype) + embedded


def talker_logits(talker: nn.Module, embeds: Tensor, **forward: object) -> tuple[Tensor, object]:
    """(codec logits [B, T, V] in fp32, the model's output) of input embeddings [B, T, E] through
    `thinker_to_talker_proj`, the talker's decoder and `codec_head`, as its forward computes them."""
    out = talker.model(inputs_embeds=talker.thinker_to_talker_proj(embeds), **forward)
    return talker.codec_head(out.last_hidden_state).float(), out


def processed_logits(logits: Tensor, seen: Tensor, suppress: int, penalty: float, temperature: float, top_k: int,
                     top_p: float, sampling: bool) -> Tensor:
    """fp32 logits [..., V] as the stock talker generation draws from them (module docstring), given `seen` [..., V]
    (bool: the ids the sequence holds so far): penalised where seen (x penalty below 0, / penalty above), `suppress`
    at -inf; with `sampling`, / temperature, all but the top_k largest (0: off) and outside the top_p nucleus
    (1: off; the most likely id always kept) at -inf."""
    logits = logits.float()
    if penalty != 1.0:
        logits = torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)
    logits = logits.index_fill(-1, torch.tensor([suppress], device=logits.device), float("-inf"))
    if not sampling:
        return logits
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = logits.sort(dim=-1)  # ascending, as transformers' TopPLogitsWarper
        drop = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[..., -1] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def seen_ids(prefix: Tensor, codes: Tensor, vocab: int) -> Tensor:
    """bool [B, T, V]: at each code position t, the ids among the prefix's codec ids `prefix` [B, L] (left padding
    with the mask id, which every prefix holds) and the codes before t (`codes` [B, T])."""
    batch, width = codes.shape
    in_prefix = torch.zeros(batch, vocab, dtype=torch.bool, device=prefix.device).scatter_(1, prefix, True)
    steps = torch.arange(width, device=codes.device)
    first = torch.full((batch, vocab), width, dtype=torch.long, device=codes.device)
    first = first.scatter_reduce(1, codes, steps.expand(batch, width), reduce="amin")  # each id's first position
    return (steps[None, :, None] > first[:, None, :]) | in_prefix[:, None]
