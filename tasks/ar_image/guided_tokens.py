"""Image tokens drawn autoregressively under classifier-free guidance, and their log-probs.

The rule is transformers' `JanusForConditionalGeneration.generate(generation_mode="image")`:
each prompt runs twice, the conditional row as written and the unconditional row with every
token but the bos and the begin-of-image token replaced by the pad token (the same attention
mask); after the prompt, both rows are fed the drawn image tokens through the generation
embeddings and aligner, and each step's scores come from the generation head. The guided logits
are ``u + s (c - u)`` (`ClassifierFreeGuidanceLogitsProcessor`), the sampled distribution
``softmax(guided / temperature)``; a unit's log-prob is the fp32 log-softmax of the guided
logits at the temperature, at the drawn token. Positions are counted over the attended tokens
(left padding takes none), so a row scores as it does alone.

`ImageTokenModel` names the parts of a model this needs (Janus's are `janus.py`'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor
from transformers import DynamicCache


@dataclass
class ImageTokenModel:
    """The parts of an autoregressive image generator the sampler and the training pass call.
    The rollout (no grad, with a KV cache): decoder(inputs_embeds, attention_mask, position_ids,
    cache) -> last hidden states [B, S, H]; text_embeddings(ids) and image_embeddings(image tokens)
    -> [B, S, H]; head(hidden) -> image-token scores [B, ..., V].
    The training pass, in one call of the (wrapped) model, so that every trained parameter is used
    inside its forward: scores(ids, attention_mask, position_ids, keep) -> the scores [B, keep, V]
    of the last `keep` positions, where `ids` hold image tokens as `image_offset` + token."""

    decoder: Callable[..., Tensor]
    text_embeddings: Callable[[Tensor], Tensor]
    image_embeddings: Callable[[Tensor], Tensor]
    head: Callable[[Tensor], Tensor]
    scores: Callable[[Tensor, Tensor, Tensor, int], Tensor]
    image_offset: int


def unconditional_ids(ids: Tensor, kept_ids: Sequence[int], pad_id: int) -> Tensor:
    """The unconditional prompt rows [B, L]: every token but `kept_ids` (bos, begin-of-image) -> pad."""
    kept = torch.zeros_like(ids, dtype=torch.bool)
    for token in kept_ids:
        kept |= ids == token
    return ids.masked_fill(~kept, pad_id)


def guided_logits(scores: Tensor, guidance_scale: float) -> Tensor:
    """fp32 guided logits [B, ..., V] from scores [2B, ..., V] (conditional rows first): u + s (c - u)."""
    cond, uncond = scores.float().chunk(2, dim=0)
    return uncond + (cond - uncond) * guidance_scale if guidance_scale != 1.0 else cond


def positions(mask: Tensor) -> Tensor:
    """Position ids [B, S] counted over the attended tokens (left padding at 0)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def draw(logits: Tensor, generators: Sequence[torch.Generator], group_size: int, greedy: bool) -> Tensor:
    """One token per row [B] from fp32 logits [B, V] (temperature applied): the argmax when `greedy`,
    else by inverse CDF with one uniform per row from its group's generator."""
    if greedy:
        return logits.argmax(-1)
    u = torch.cat([torch.rand(group_size, generator=g) for g in generators]).to(logits.device)
    cdf = logits.softmax(-1).cumsum(-1)
    return torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=logits.shape[-1] - 1)[:, 0]


@torch.no_grad()
def sample_image_tokens(parts: ImageTokenModel, ids: Tensor, mask: Tensor, uncond: Tensor, num_tokens: int,
                        guidance_scale: float, temperature: float, generators: Sequence[torch.Generator],
                        group_size: int, greedy: bool) -> tuple[Tensor, Tensor]:
    """`num_tokens` image tokens [B, T] per prompt row (ids, mask, uncond: [B, L]) and the fp32
    log-probs [B, T] of the guided sampler at the drawn tokens, with a KV cache."""
    mask2 = torch.cat([mask, mask])
    embeds = parts.text_embeddings(torch.cat([ids, uncond]))
    pos = positions(mask2)
    cache = DynamicCache()
    tokens, logps = [], []
    for _ in range(num_tokens):
        hidden = parts.decoder(embeds, mask2, pos, cache)[:, -1]
        logits = guided_logits(parts.head(hidden), guidance_scale) / temperature
        token = draw(logits, generators, group_size, greedy)
        tokens.append(token)
        logps.append(logits.log_softmax(-1).gather(1, token[:, None])[:, 0])
        embeds = parts.image_embeddings(torch.cat([token, token])[:, None])
        mask2 = torch.cat([mask2, mask2.new_ones(len(mask2), 1)], 1)
        pos = pos[:, -1:] + 1
    return torch.stack(tokens, 1), torch.stack(logps, 1)


def image_token_logprobs(parts: ImageTokenModel, ids: Tensor, mask: Tensor, uncond: Tensor, tokens: Tensor,
                         units: slice, guidance_scale: float, temperature: float,
                         with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """fp32 log-probs [B, u] (and entropies) of image tokens [B, T] in `units`, in one forward over
    the prompt and the tokens before the last scored one (the training pass; under grad)."""
    start, stop, _ = units.indices(tokens.shape[1])
    fed = torch.cat([tokens[:, :stop - 1]] * 2) + parts.image_offset  # [2B, stop-1]: what each scored token follows
    seq = torch.cat([torch.cat([ids, uncond]), fed], 1)
    mask2 = torch.cat([mask, mask])
    mask2 = torch.cat([mask2, mask2.new_ones(len(mask2), fed.shape[1])], 1)
    scores = parts.scores(seq, mask2, positions(mask2), stop)[:, start:]  # positions L-1+start .. L-2+stop
    logp_all = (guided_logits(scores, guidance_scale) / temperature).log_softmax(-1)
    logp = logp_all.gather(-1, tokens[:, start:stop, None])[..., 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy


def decoded_pixels(pixels: Tensor) -> list:
    """PIL images from decoded pixels [B, H, W, 3] in [-1, 1] (the Janus-Pro image processor's
    postprocess: x 0.5 + 0.5, times 255, clipped, cast to uint8)."""
    from PIL import Image
    data = ((pixels.float() * 0.5 + 0.5) * 255).clip(0, 255).to(torch.uint8).cpu().numpy()
    return [Image.fromarray(a) for a in data]

