"""Image tokens drawn autoregressively under classifier-free guidance, and their log-probs.

Each prompt runs twice, a conditional row and an unconditional one (the family writes both: Janus
pads out the prompt, Emu3 writes a negative prompt); after the prompt both rows are fed the drawn
image tokens, and where the family lays the image out in rows (Emu3) a row-end token after each
full row, which the rule forces, so it is fed but is no unit. The guided logits are ``u + s (c - u)``
over the image codebook, the sampled distribution ``softmax(guided / temperature)``; a unit's
log-prob is the fp32 log-softmax of the guided logits at the temperature, at the drawn token.
(Janus's rule, `ClassifierFreeGuidanceLogitsProcessor`, mixes the logits; Emu3's,
`UnbatchedClassifierFreeGuidanceLogitsProcessor`, mixes the conditional and unconditional
log-softmaxes over the whole vocabulary and then masks all but the visual tokens: the two
normalisers are a constant per row, which the temperature's softmax cancels, so both are this one
distribution; docs/methods.md.) Positions are counted over the attended tokens (left padding takes
none), so a row scores as it does alone.

`ImageTokenModel` names the parts of a model this needs (`janus.py`'s, `emu3.py`'s).
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
    inside its forward: scores(ids, attention_mask, position_ids, keep) -> the codebook's scores
    [B, keep, V] of the last `keep` positions, where `ids` hold image tokens as `input_ids(tokens)`.
    `row_width` > 0: the image is laid out in rows of that many tokens, each full row but the last
    followed by the `row_end` token (an id of the text embeddings); 0: no row ends."""

    decoder: Callable[..., Tensor]
    text_embeddings: Callable[[Tensor], Tensor]
    image_embeddings: Callable[[Tensor], Tensor]
    head: Callable[[Tensor], Tensor]
    scores: Callable[[Tensor, Tensor, Tensor, int], Tensor]
    input_ids: Callable[[Tensor], Tensor]
    row_width: int = 0
    row_end: int = -1

    def offsets(self, n: int) -> Tensor:
        """Where each of the first `n` units sits [n] among the tokens fed after the prompt (row ends counted)."""
        k = torch.arange(n)
        return k + k // self.row_width if self.row_width else k

    def fed_ids(self, tokens: Tensor) -> Tensor:
        """The ids [B, n + row ends] that image tokens [B, n] are fed as, a row end after each full row."""
        ids = self.input_ids(tokens)
        if not self.row_width:
            return ids
        n = tokens.shape[1]
        out = ids.new_full((len(ids), n + n // self.row_width), self.row_end)
        out[:, self.offsets(n).to(ids.device)] = ids
        return out


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
def sample_image_tokens(parts: ImageTokenModel, rows: Tensor, mask: Tensor, num_tokens: int,
                        guidance_scale: float, temperature: float, generators: Sequence[torch.Generator],
                        group_size: int, greedy: bool) -> tuple[Tensor, Tensor]:
    """`num_tokens` image tokens [B, T] per prompt (rows, mask: [2B, L], the conditional rows then
    the unconditional ones) and the fp32 log-probs [B, T] of the guided sampler at the drawn tokens,
    with a KV cache."""
    embeds, pos, cache = parts.text_embeddings(rows), positions(mask), DynamicCache()
    tokens, logps = [], []
    for k in range(num_tokens):
        hidden = parts.decoder(embeds, mask, pos, cache)[:, -1]
        logits = guided_logits(parts.head(hidden), guidance_scale) / temperature
        token = draw(logits, generators, group_size, greedy)
        tokens.append(token)
        logps.append(logits.log_softmax(-1).gather(1, token[:, None])[:, 0])
        embeds = parts.image_embeddings(torch.cat([token, token])[:, None])
        if parts.row_width and (k + 1) % parts.row_width == 0 and k + 1 < num_tokens:  # a forced row end
            row_end = parts.text_embeddings(torch.full_like(rows[:, :1], parts.row_end))
            embeds = torch.cat([embeds, row_end.to(embeds.dtype)], 1)
        step = embeds.shape[1]
        mask = torch.cat([mask, mask.new_ones(len(mask), step)], 1)
        pos = pos[:, -1:] + torch.arange(1, step + 1, device=pos.device)
    return torch.stack(tokens, 1), torch.stack(logps, 1)


def image_token_logprobs(parts: ImageTokenModel, rows: Tensor, mask: Tensor, tokens: Tensor,
                         units: slice, guidance_scale: float, temperature: float,
                         with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """fp32 log-probs [B, u] (and entropies) of image tokens [B, T] in `units`, prompts as in
    `sample_image_tokens` (rows, mask: [2B, L]), in one forward over the prompt and what is fed
    before the last scored unit (the training pass; under grad)."""
    start, stop, _ = units.indices(tokens.shape[1])
    at = parts.offsets(stop).to(tokens.device)  # [stop]: where each unit sits after the prompt
    fed = torch.cat([parts.fed_ids(tokens[:, :stop])[:, :at[-1]]] * 2)  # [2B, at[-1]]: what the last unit follows
    seq = torch.cat([rows, fed], 1)
    mask2 = torch.cat([mask, mask.new_ones(len(mask), fed.shape[1])], 1)
    scores = parts.scores(seq, mask2, positions(mask2), int(at[-1]) + 1)[:, at[start:]]  # positions L-1+at
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

