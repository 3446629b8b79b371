"""Video clips for the vision-language adapter: decoding with PyAV, frame sampling by count or by
rate, and the frame shuffles of T-GRPO (Video-R1).

A video in a data set's video column is a path (decoded with PyAV), a list of frames (PIL images
or H x W x 3 uint8 arrays) or a [T, H, W, 3] array, or ``{"frames": ..., "fps": rate}``; frames
given without a rate are taken as sampled at 2 frames per second (qwen-vl-utils' rate). A row's
value may also be a list of such videos.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.data.images import rgb_image

DEFAULT_FPS = 2.0


@dataclass
class Clip:
    """The sampled frames of one video, in time order, with where they came from: `indices[k]` is
    the source index of `frames[k]`, `total_frames` and `fps` describe the source."""

    frames: np.ndarray  # [T, H, W, 3] uint8
    indices: list[int]
    total_frames: int
    fps: float

    def metadata(self):
        """The processor's `VideoMetadata` (Qwen2.5-VL derives `second_per_grid_ts` from it)."""
        from transformers.video_utils import VideoMetadata
        return VideoMetadata(total_num_frames=self.total_frames, fps=self.fps, frames_indices=list(self.indices),
                             height=int(self.frames.shape[1]), width=int(self.frames.shape[2]))

    def permuted(self, order: list[int]) -> "Clip":
        """The same clip with its frames in `order` (timestamps and metadata unchanged, so the
        model sees the shuffled content at the original time positions)."""
        return replace(self, frames=self.frames[order])


def sample_indices(total: int, source_fps: float, num_frames: int | None = None, fps: float | None = None,
                   max_frames: int | None = None) -> list[int]:
    """Source frame indices to keep. `num_frames`: that many, evenly spaced from the first frame
    to the last (all of them when the video is shorter). `fps`: one frame every 1 / fps seconds
    from t = 0 (frame floor(t * source_fps)). Neither: every frame. More than `max_frames`
    indices are thinned to `max_frames` evenly spaced ones, so the clip still spans the video."""
    if total < 1:
        raise ValueError("a video needs at least one frame")
    if num_frames is not None and fps is not None:
        raise ValueError(f"give num_frames ({num_frames}) or fps ({fps}), not both")
    if num_frames is not None:
        if num_frames < 1:
            raise ValueError(f"num_frames={num_frames} must be >= 1")
        picked = evenly_spaced(total, min(num_frames, total))
    elif fps is not None:
        if not fps > 0:
            raise ValueError(f"fps={fps} must be > 0")
        step = source_fps / fps
        picked = sorted({min(int(k * step), total - 1) for k in range(int(np.ceil(total / step)))})
    else:
        picked = list(range(total))
    if max_frames is not None and len(picked) > max_frames:
        picked = [picked[i] for i in evenly_spaced(len(picked), max_frames)]
    return picked


def evenly_spaced(total: int, n: int) -> list[int]:
    """`n` indices from 0 to total - 1, evenly spaced and rounded (one: the first)."""
    if n == 1:
        return [0]
    return np.linspace(0, total - 1, n).round().astype(int).tolist()


def _frame_array(frame: Any, k: int) -> np.ndarray:
    from PIL import Image
    array = np.asarray(rgb_image(frame, f"video frame {k}") if isinstance(frame, Image.Image) else frame)
    if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np.uint8:
        raise ValueError(f"video frame {k} must be an RGB image or an H x W x 3 uint8 array; got "
                         f"{array.dtype} of shape {array.shape}")
    return array


def _decode(path: Any, num_frames: int | None, fps: float | None, max_frames: int | None) -> Clip:
    import av
    try:
        with av.open(path) as container:
            if not container.streams.video:
                raise ValueError("no video stream")
            stream = container.streams.video[0]
            source_fps = float(stream.average_rate or stream.guessed_rate or DEFAULT_FPS)
            total = stream.frames or sum(1 for _ in container.decode(stream))
            wanted = set(sample_indices(total, source_fps, num_frames, fps, max_frames))
            container.seek(0)
            kept: dict[int, np.ndarray] = {}
            for k, frame in enumerate(container.decode(stream)):
                if k in wanted:
                    kept[k] = frame.to_ndarray(format="rgb24")
    except (OSError, ValueError, av.FFmpegError) as e:
        raise ValueError(f"video {path!r} cannot be read: {e}") from e
    if not kept:
        raise ValueError(f"video {path!r} cannot be read: no frame decoded")
    # a container that over-reports its frame count leaves the last wanted frames undecoded
    indices = sorted(kept)
    return Clip(np.stack([kept[k] for k in indices]), indices, max(total, indices[-1] + 1), source_fps)


def load_video(video: Any, num_frames: int | None = None, fps: float | None = None,
               max_frames: int | None = None) -> Clip:
    """A `Clip` from a path, a list or array of frames, or {"frames", "fps"}, sampled by count or
    by rate (`sample_indices`). An unreadable file fails naming its path."""
    if isinstance(video, Clip):
        return video
    if isinstance(video, (str, Path)):
        return _decode(str(video), num_frames, fps, max_frames)
    if _is_file_dict(video):  # a Hugging Face video value
        return _decode(io.BytesIO(video["bytes"]) if video.get("bytes") else str(video["path"]),
                       num_frames, fps, max_frames)
    source_fps = DEFAULT_FPS
    if isinstance(video, dict):
        if "frames" not in video:
            raise TypeError(f"a video given as a dict needs 'frames' (and optionally 'fps'); got keys {sorted(video)}")
        source_fps, video = float(video.get("fps") or DEFAULT_FPS), video["frames"]
    frames = list(video) if isinstance(video, (list, tuple, np.ndarray)) else None
    if not frames:
        raise TypeError(f"a video must be a path, a list of frames or {{'frames', 'fps'}}; got {type(video).__name__}")
    indices = sample_indices(len(frames), source_fps, num_frames, fps, max_frames)
    arrays = [_frame_array(frames[k], k) for k in indices]
    if len({a.shape for a in arrays}) > 1:
        raise ValueError(f"the frames of a video differ in size: {sorted({a.shape for a in arrays})}")
    return Clip(np.stack(arrays), indices, len(frames), source_fps)


def _is_file_dict(video: Any) -> bool:
    return isinstance(video, dict) and "frames" not in video and bool(video.get("bytes") or video.get("path"))


def check_video(value: Any) -> None:
    """Raise `mmrl.data.RowError` unless every video of a column value (one or a list) is frames, or
    a file whose container opens with a video stream (headers only: no frame is decoded)."""
    import av

    from mmrl.data import RowError
    for video in [value] if is_single_video(value) else list(value):
        if isinstance(video, (str, Path)) or _is_file_dict(video):
            source = video if isinstance(video, (str, Path)) else (
                io.BytesIO(video["bytes"]) if video.get("bytes") else video["path"])
            if isinstance(source, (str, Path)) and not Path(source).is_file():
                raise RowError(None, "video file does not exist", str(source))
            try:
                with av.open(source) as container:
                    if not container.streams.video:
                        raise ValueError("no video stream")
            except (OSError, ValueError, av.FFmpegError) as e:
                raise RowError(None, "video cannot be opened", f"{source if isinstance(source, (str, Path)) else '<bytes>'}: {e}") from None
        elif isinstance(video, dict) and "frames" not in video:
            raise RowError(None, "not a video", f"a dict without 'frames', 'path' or 'bytes': keys {sorted(video)}")
        elif not isinstance(video, (dict, list, tuple, np.ndarray, Clip)):
            raise RowError(None, "not a video", type(video).__name__)


def is_single_video(value: Any) -> bool:
    """Whether a video column's value is one video (rather than a list of videos): a path, a
    dict, a Clip, a [T, H, W, 3] array, or a list whose items are frames."""
    from PIL import Image
    if isinstance(value, (str, Path, dict, Clip)):
        return True
    if isinstance(value, np.ndarray):
        return value.ndim == 4
    if isinstance(value, (list, tuple)) and value:
        first = value[0]
        return isinstance(first, Image.Image) or (isinstance(first, np.ndarray) and first.ndim == 3)
    return False


def shuffled_order(n: int, generator: torch.Generator) -> list[int]:
    """A random permutation of range(n) that is not the identity (for n >= 2)."""
    while True:
        order = torch.randperm(n, generator=generator).tolist()
        if n < 2 or order != list(range(n)):
            return order
