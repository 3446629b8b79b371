"""Temporal consistency of a video: how alike consecutive frames are.

    temporal_consistency = aggregate over t of cos(e(frame_t), e(frame_t+1))

with e the frame's CLIP image embedding (``embedding: clip``, open_clip's `model` /
`pretrained` / `model_config` as the `clip` reward) or its pixels flattened
(``embedding: pixels``, no model), and `aggregate` ``mean`` or ``min`` over the T - 1 pairs. 1
is a still video; a flicker or a cut lowers it.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from mmrl.core.scoring import register_reward

from .clip import _device, image_embeddings, load_clip
from .video_frames import FRAME_AGGREGATIONS, frame_tensor, pil_frames

PAIR_AGGREGATIONS = ("mean", "min")


def pixel_embeddings(video: Any) -> Tensor:
    """[T, C*H*W] each frame's pixels in [0, 1], L2-normalised."""
    flat = frame_tensor(video).flatten(1)
    return flat / flat.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def consecutive_similarity(embeddings: Tensor) -> Tensor:
    """[T-1]: cosines of consecutive rows of L2-normalised `embeddings` [T, D]."""
    return (embeddings[:-1] * embeddings[1:]).sum(-1)


@register_reward("temporal_consistency")
def temporal_consistency(prompts, completions, embedding: str = "clip", aggregate: str = "mean",
                         model: str = "ViT-L-14", pretrained: str | None = "openai", model_config: str | None = None,
                         device: str | None = None, batch_size: int = 32, **columns):
    if embedding not in ("clip", "pixels"):
        raise ValueError(f"temporal_consistency: embedding={embedding!r} is not one of clip, pixels")
    if aggregate not in PAIR_AGGREGATIONS:
        raise ValueError(f"temporal_consistency: aggregate={aggregate!r} is not one of {', '.join(PAIR_AGGREGATIONS)}")
    out = []
    for video in completions:
        if embedding == "pixels":
            emb = pixel_embeddings(video)
        else:
            dev = _device(device)
            net, preprocess, _ = load_clip(model, pretrained, model_config, dev)
            emb = image_embeddings(net, preprocess, pil_frames(video), batch_size, dev).cpu()
        if emb.shape[0] < 2:
            raise ValueError(f"temporal_consistency needs videos of at least 2 frames; got {emb.shape[0]}")
        out.append(FRAME_AGGREGATIONS[aggregate](consecutive_similarity(emb).tolist()))
    return out
