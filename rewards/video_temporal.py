"""Consistency of a video: how alike consecutive frames are, and (image-to-video) how alike its
frames are to the conditioning image.

    temporal_consistency = aggregate over t of cos(e(frame_t), e(frame_t+1))
    image_consistency    = aggregate over the chosen frames t of cos(e(image), e(frame_t))

with e the frame's CLIP image embedding (``embedding: clip``, open_clip's `model` /
`pretrained` / `model_config` as the `clip` reward) or its pixels flattened
(``embedding: pixels``, no model; the conditioning image resized to the frames' size), and
`aggregate` ``mean`` or ``min``. A still video has temporal consistency 1; a flicker or a cut
lowers it. `image` is the row's conditioning image column (a PIL image or a path), `frames` as
in rewards/video_frames.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from torch import Tensor

from mmrl.core.scoring import register_reward

from .clip import _device, image_embeddings, load_clip
from .outputs import VIDEO
from .video_frames import FRAME_AGGREGATIONS, Frames, frame_indices, frame_tensor, pil_frames

Embedding = Literal["clip", "pixels"]
PairAggregation = Literal["mean", "min"]
PAIR_AGGREGATIONS = get_args(PairAggregation)


def pixel_embeddings(video: Any) -> Tensor:
    """[T, C*H*W] each frame's pixels in [0, 1], L2-normalised."""
    flat = frame_tensor(video).flatten(1)
    return flat / flat.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def consecutive_similarity(embeddings: Tensor) -> Tensor:
    """[T-1]: cosines of consecutive rows of L2-normalised `embeddings` [T, D]."""
    return (embeddings[:-1] * embeddings[1:]).sum(-1)


def _embeddings(frames: Any, embedding: str, model, pretrained, model_config, device, batch_size) -> Tensor:
    """[T, D] L2-normalised embeddings of `frames` (a video, module docstring)."""
    if embedding == "pixels":
        return pixel_embeddings(frames)
    dev = _device(device)
    net, preprocess, _ = load_clip(model, pretrained, model_config, dev)
    return image_embeddings(net, preprocess, pil_frames(frames), batch_size, dev).cpu()


def _check(name: str, embedding: str, aggregate: str) -> None:
    if embedding not in get_args(Embedding):
        raise ValueError(f"{name}: embedding={embedding!r} is not one of {', '.join(get_args(Embedding))}")
    if aggregate not in PAIR_AGGREGATIONS:
        raise ValueError(f"{name}: aggregate={aggregate!r} is not one of {', '.join(PAIR_AGGREGATIONS)}")


def conditioning_image(value: Any):
    """The conditioning image of a row as an RGB PIL image (a PIL image or a path)."""
    from PIL import Image
    if isinstance(value, (str, Path)):
        if not Path(value).is_file():
            raise FileNotFoundError(f"image_consistency: conditioning image {str(value)!r} does not exist")
        value = Image.open(value)
    if not hasattr(value, "convert"):
        raise ValueError(f"image_consistency: the column 'image' holds a {type(value).__name__}, not an image or a path")
    return value.convert("RGB")


@register_reward("image_consistency", outputs=VIDEO)
def image_consistency(prompts, completions, image, embedding: Embedding = "clip", frames: Frames = "all",
                      aggregate: PairAggregation = "mean", model: str = "ViT-L-14", pretrained: str | None = "openai",
                      model_config: str | None = None, device: str | None = None, batch_size: int = 32, **columns):
    _check("image_consistency", embedding, aggregate)
    out = []
    for video, condition in zip(completions, image):
        every = pil_frames(video)
        chosen = [every[i] for i in frame_indices(len(every), frames)]
        start = conditioning_image(condition).resize(chosen[0].size)
        emb = _embeddings([start, *chosen], embedding, model, pretrained, model_config, device, batch_size)
        out.append(FRAME_AGGREGATIONS[aggregate]((emb[1:] @ emb[0]).tolist()))
    return out


@register_reward("temporal_consistency", outputs=VIDEO)
def temporal_consistency(prompts, completions, embedding: Embedding = "clip", aggregate: PairAggregation = "mean",
                         model: str = "ViT-L-14", pretrained: str | None = "openai", model_config: str | None = None,
                         device: str | None = None, batch_size: int = 32, **columns):
    _check("temporal_consistency", embedding, aggregate)
    out = []
    for video in completions:
        emb = _embeddings(video, embedding, model, pretrained, model_config, device, batch_size)
        if emb.shape[0] < 2:
            raise ValueError(f"temporal_consistency needs videos of at least 2 frames; got {emb.shape[0]}")
        out.append(FRAME_AGGREGATIONS[aggregate](consecutive_similarity(emb).tolist()))
    return out
