"""CLIP directional similarity of an image edit (`clip_direction`): how far the change from the
source image to the edit points the way the change from the source caption to the target caption
points, in CLIP space (StyleGAN-NADA's direction, InstructPix2Pix's editing metric):

    cos(E_img(edit) - E_img(source), E_txt(target caption) - E_txt(source caption))

with each embedding L2-normalised first, as InstructPix2Pix's `metrics/clip_similarity.py`
computes its `sim_direction`. In [-1, 1]; an edit that changes nothing has no direction and scores
0. The source image, the source caption and the target caption are data columns (`image`,
`source_caption`, `target_caption`; rename them with `rewards.clip_direction.columns`). The CLIP
model is loaded as the `clip` reward loads it (`rewards/clip.py`: `model`, `pretrained`,
`model_config`)."""

from __future__ import annotations

from typing import Sequence

import torch

from mmrl.core.scoring import register_reward

from .clip import _device, image_embeddings, load_clip, text_embeddings
from .edit_consistency import source_image
from .outputs import IMAGE


def directional_similarity(edit: torch.Tensor, source: torch.Tensor, target_text: torch.Tensor,
                           source_text: torch.Tensor) -> torch.Tensor:
    """cos(edit - source, target_text - source_text) per row of the normalised embeddings [N, D];
    0 where either difference is zero."""
    image_step, text_step = edit - source, target_text - source_text
    norms = image_step.norm(dim=-1) * text_step.norm(dim=-1)
    cos = (image_step * text_step).sum(-1) / norms.clamp(min=1e-12)
    return torch.where(norms > 0, cos, torch.zeros_like(cos))


@register_reward("clip_direction", outputs=IMAGE)
def clip_direction(prompts, completions, image: Sequence, source_caption: Sequence[str],
                   target_caption: Sequence[str], model: str = "ViT-L-14", pretrained: str | None = "openai",
                   model_config: str | None = None, device: str | None = None, batch_size: int = 32, **columns):
    dev = _device(device)
    net, preprocess, tokenizer = load_clip(model, pretrained, model_config, dev)
    sources = [source_image(value) for value in image]
    edit = image_embeddings(net, preprocess, list(completions), batch_size, dev)
    source = image_embeddings(net, preprocess, sources, batch_size, dev)
    target_text = text_embeddings(net, tokenizer, [str(c) for c in target_caption], batch_size, dev)
    source_text = text_embeddings(net, tokenizer, [str(c) for c in source_caption], batch_size, dev)
    return directional_similarity(edit, source, target_text, source_text).tolist()
