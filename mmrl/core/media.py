"""What a completion is, for the users who look at it: a `Medium` (text, an image, a video or audio,
as uint8 pixels or float samples with their rate). A policy says what each of its completions is
(`Policy.sample_medium`); `medium` is the default, by the completion's type: text; an image (a PIL
image); a video (a [T, C, H, W] tensor or array, float in [0, 1] or uint8, or a list of PIL frames;
its frame rate from the row's `fps` column, else 8); audio (a 1-D float array, or {"array",
"sampling_rate"}; the rate from the row's `sampling_rate` column, else 16000); a video with its sound
track ({"frames": a video as above, "array": its samples, "sampling_rate": their rate})."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

DEFAULT_FPS, DEFAULT_SAMPLE_RATE = 8.0, 16000


@dataclass
class Medium:
    """A completion as users see it in TensorBoard and W&B (mmrl/train/reporting/eval_samples.py).
    kind: text | image | video | audio | audio_video (a video with its sound track); data: str, uint8
    [H, W, 3], uint8 [T, H, W, 3] (video, audio_video), or float [S] in [-1, 1]; rate: frames or
    samples per second (video, audio_video; audio); sound: the sound track, float [S] in [-1, 1], and
    sound_rate its samples per second (audio_video)."""

    kind: str
    data: Any
    rate: float | None = None
    sound: Any = None
    sound_rate: float | None = None


def _uint8_frames(frames: Any) -> np.ndarray:
    """[T, H, W, 3] uint8 from a [T, C, H, W] tensor / array (float in [0, 1] or uint8) or PIL frames."""
    if isinstance(frames, (list, tuple)):
        return np.stack([np.asarray(f.convert("RGB")) for f in frames])
    if hasattr(frames, "detach"):
        frames = frames.detach().cpu()
        frames = frames if frames.dtype == torch.uint8 else frames.float()
    array = np.asarray(frames)
    if array.dtype != np.uint8:
        array = (np.clip(array, 0, 1) * 255).round().astype(np.uint8)
    array = array.transpose(0, 2, 3, 1)
    return np.repeat(array, 3, axis=-1) if array.shape[-1] == 1 else array


def medium(completion: Any, columns: dict[str, Any]) -> Medium:
    """The medium of one completion (module docstring); `columns` its row's column values."""
    if isinstance(completion, str):
        return Medium("text", completion)
    if hasattr(completion, "convert") and hasattr(completion, "size"):
        return Medium("image", np.asarray(completion.convert("RGB")))
    if isinstance(completion, dict) and "frames" in completion and "array" in completion:
        return Medium("audio_video", _uint8_frames(completion["frames"]), float(columns.get("fps") or DEFAULT_FPS),
                      np.asarray(completion["array"], dtype=np.float32).reshape(-1),
                      float(completion.get("sampling_rate", DEFAULT_SAMPLE_RATE)))
    if isinstance(completion, dict) and "array" in completion:
        return Medium("audio", np.asarray(completion["array"], dtype=np.float32).reshape(-1),
                      float(completion.get("sampling_rate", DEFAULT_SAMPLE_RATE)))
    shape = getattr(completion, "shape", None)
    if isinstance(completion, (list, tuple)) or (shape is not None and len(shape) == 4):
        return Medium("video", _uint8_frames(completion), float(columns.get("fps") or DEFAULT_FPS))
    if shape is not None and len(shape) == 1:
        samples = completion.detach().cpu().float().numpy() if hasattr(completion, "detach") else completion
        return Medium("audio", np.asarray(samples, dtype=np.float32),
                      float(columns.get("sampling_rate") or DEFAULT_SAMPLE_RATE))
    return Medium("text", str(completion))


MediumOf = Callable[[Any, dict[str, Any]], Medium]  # (completion, its row's column values) -> its medium
