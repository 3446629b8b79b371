"""VBench's per-video scores of the dimensions mmrl computes (Huang et al. 2024, Vchitect/VBench
``vbench/*.py``), each written from the published protocol and checked against VBench's code on
identical inputs (docs/bench.md#vbench-vbench). A video is [T, H, W, 3] uint8 frames.

  subject_consistency     DINO ViT-B/16 CLS features of each frame (resized, shorter side 224,
                          bilinear, ImageNet normalisation), `consistency`
  background_consistency  CLIP ViT-B/32 image features (resized bicubic to 224, centre crop, CLIP
                          normalisation), `consistency`
  temporal_flickering     (255 - mean over consecutive frames of the mean absolute pixel
                          difference) / 255
  aesthetic_quality       the LAION aesthetic head (a Linear on normalised CLIP ViT-L/14 features,
                          VBench's `sa_0_4_vit_l_14_linear.pth`) / 10, mean over frames
  imaging_quality         MUSIQ (pyiqa's architecture, VBench's SPAQ-trained checkpoint) of each
                          frame in [0, 1], frames whose longer side is over 512 first resized
                          (bilinear, no antialias) to 512 on that side (VBench's default
                          ``longer`` preprocessing), mean over frames / 100
  dynamic_degree          1 when the video moves: frames taken every round(fps / 8), the optical
                          flow of each consecutive pair (RAFT, 20 iterations, frames padded to a
                          multiple of 8 by replication), its score the mean of its largest 5% flow
                          magnitudes; moving when at least round(4 x frames / 16) pairs score above
                          6 x min(H, W) / 256

with ``consistency`` of unit features f_0..f_{T-1} the mean over t >= 1 of
(max(0, f_{t-1} . f_t) + max(0, f_0 . f_t)) / 2.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from .scorer_models import scorer_model

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CLIP_NORM = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
RAFT_MIN_SIDE = 128  # torchvision's RAFT needs feature maps of at least 16 x 16 at 1/8 scale
MUSIQ_LONGER_SIDE = 512  # VBench's imaging_quality resizes frames whose longer side is over this


def frames_uint8(video: Any) -> np.ndarray:
    """[T, H, W, 3] uint8 from a video as the harness reads it back (uint8 frames, or floats in [0, 1])."""
    frames = np.asarray(video)
    if frames.ndim != 4:
        raise ValueError(f"vbench: a video must be [T, H, W, C] frames; got shape {frames.shape}")
    if frames.shape[-1] not in (1, 3) and frames.shape[1] in (1, 3):
        frames = frames.transpose(0, 2, 3, 1)
    if frames.dtype != np.uint8:
        frames = np.clip(np.round(frames.astype(np.float64) * 255), 0, 255).astype(np.uint8)
    return np.repeat(frames, 3, axis=-1) if frames.shape[-1] == 1 else frames


def consistency(features: torch.Tensor) -> float:
    """The consistency of [T, D] features (module docstring); normalised here."""
    f = F.normalize(features.float(), dim=-1)
    previous = (f[:-1] * f[1:]).sum(-1).clamp_min(0)
    first = (f[:1] * f[1:]).sum(-1).clamp_min(0)
    return float(((previous + first) / 2).mean())


def temporal_flickering(video: Any) -> float:
    frames = frames_uint8(video).astype(np.float32)
    return float((255.0 - np.abs(frames[1:] - frames[:-1]).mean(axis=(1, 2, 3)).mean()) / 255.0)


def _tensor(video: Any) -> torch.Tensor:
    """[T, 3, H, W] float 0-255."""
    return torch.from_numpy(frames_uint8(video)).permute(0, 3, 1, 2).float()


def resize_shorter(frames: torch.Tensor, side: int, mode: str) -> torch.Tensor:
    """0-255 frames resized so their shorter side is `side` (the longer int(side x long / short)), no
    antialias, rounded back to 0-255 integers (as torchvision resizes VBench's uint8 frames)."""
    h, w = frames.shape[-2:]
    size = (side, int(side * w / h)) if h <= w else (int(side * h / w), side)
    return F.interpolate(frames, size=size, mode=mode, align_corners=False).clamp(0, 255).round()


def _normalise(frames: torch.Tensor, stats) -> torch.Tensor:
    mean, std = (torch.tensor(s).view(1, 3, 1, 1) for s in stats)
    return (frames / 255.0 - mean) / std


def clip_pixels(video: Any, side: int = 224) -> torch.Tensor:
    """VBench's clip_transform: bicubic to `side` (shorter side), centre crop, CLIP normalisation."""
    frames = resize_shorter(_tensor(video), side, "bicubic")
    h, w = frames.shape[-2:]
    top, left = int(round((h - side) / 2.0)), int(round((w - side) / 2.0))
    return _normalise(frames[..., top:top + side, left:left + side], CLIP_NORM)


@functools.lru_cache(maxsize=2)
def dino_model(path: str, device: str):
    from transformers import ViTModel
    return scorer_model(ViTModel, path, "vbench: dino_path", device, add_pooling_layer=False)  # e.g. facebook/dino-vitb16


@torch.no_grad()
def subject_consistency(video: Any, path: str, device: str) -> float:
    model = dino_model(path, device)
    pixels = _normalise(resize_shorter(_tensor(video), 224, "bilinear"), IMAGENET).to(device)
    return consistency(model(pixel_values=pixels, interpolate_pos_encoding=True).last_hidden_state[:, 0])


@torch.no_grad()
def background_consistency(video: Any, net: Any, device: str) -> float:
    return consistency(net.encode_image(clip_pixels(video).to(device)))


@torch.no_grad()
def aesthetic_quality(video: Any, net: Any, head: Any, device: str) -> float:
    features = F.normalize(net.encode_image(clip_pixels(video).to(device)).float(), dim=-1)
    return float((head(features).squeeze(-1) / 10).mean())


@functools.lru_cache(maxsize=2)
def musiq_model(path: str, arch: str | None, device: str):
    """pyiqa's MUSIQ (the ``imaging`` extra) with the weights at `path` (a file, or a URL pyiqa downloads
    and caches); its architecture pyiqa's defaults (the SPAQ checkpoint's) or the arguments in the JSON
    file `arch`."""
    try:
        from pyiqa.archs.musiq_arch import MUSIQ
    except ImportError:
        raise ImportError("vbench: imaging_quality needs pyiqa (pip install -e \".[imaging]\"), "
                          "or leave it out of --option compute=...") from None
    if not path.startswith(("https://", "http://")) and not Path(path).is_file():
        raise FileNotFoundError(f"vbench: musiq_path {path!r} does not exist (MUSIQ's SPAQ checkpoint, "
                                "musiq_spaq_ckpt-358bb6af.pth)")
    kwargs = json.loads(Path(arch).read_text()) if arch else {}
    return MUSIQ(pretrained_model_path=path, **kwargs).to(device).eval()


def musiq_frames(video: Any) -> torch.Tensor:
    """[T, 3, H, W] in [0, 1] as VBench's imaging quality feeds MUSIQ: a longer side over 512 resized
    to 512 (the other int(512 x side / longer)), bilinear without antialias, not rounded."""
    frames = _tensor(video)
    h, w = frames.shape[-2:]
    if max(h, w) > MUSIQ_LONGER_SIDE:
        scale = MUSIQ_LONGER_SIDE / max(h, w)
        frames = F.interpolate(frames, size=(int(scale * h), int(scale * w)), mode="bilinear", align_corners=False,
                               antialias=False)
    return frames / 255.0


@torch.no_grad()
def imaging_quality(video: Any, path: str, arch: str | None, device: str) -> float:
    model = musiq_model(path, arch, device)
    frames = musiq_frames(video).to(device)
    return float(np.mean([float(model(frame[None])) for frame in frames]) / 100.0)


@functools.lru_cache(maxsize=2)
def raft_model(path: str, device: str):
    """torchvision's RAFT (large) with the weights at `path` (a torchvision RAFT state dict)."""
    from torchvision.models.optical_flow import raft_large
    if not Path(path).is_file():
        raise FileNotFoundError(f"vbench: raft_path {path!r} does not exist (torchvision raft_large weights)")
    model = raft_large(weights=None)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.to(device).eval()


def top_flow(flow: torch.Tensor) -> float:
    """The mean of the largest 5% of the flow's magnitudes ([2, H, W])."""
    magnitude = flow.float().norm(dim=0).flatten()
    return float(magnitude.sort(descending=True).values[:int(magnitude.numel() * 0.05)].mean())


def moves(scores: list[float], height: int, width: int, frames: int) -> bool:
    """VBench's decision: at least round(4 x frames / 16) pair scores above 6 x min(H, W) / 256."""
    threshold, needed = 6.0 * (min(height, width) / 256.0), round(4 * (frames / 16.0))
    count = 0
    for score in scores:
        count += score > threshold
        if count >= needed:
            return True
    return False


def _padded(frames: torch.Tensor) -> torch.Tensor:
    h, w = frames.shape[-2:]
    ph, pw = (-h) % 8, (-w) % 8
    return F.pad(frames, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2], mode="replicate")


@torch.no_grad()
def dynamic_degree(video: Any, fps: float | None, path: str, device: str) -> float:
    frames = _tensor(video)[::max(1, round((fps or 8) / 8))]
    height, width = frames.shape[-2:]
    if min(height, width) < RAFT_MIN_SIDE:  # scaled up with the threshold, which follows the size
        frames = resize_shorter(frames, RAFT_MIN_SIDE, "bilinear")
    model, padded = raft_model(path, device), _padded(frames).to(device) / 127.5 - 1
    scores = [top_flow(model(a[None], b[None], num_flow_updates=20)[-1][0]) for a, b in zip(padded[:-1], padded[1:])]
    return float(moves(scores, *frames.shape[-2:], len(frames)))
