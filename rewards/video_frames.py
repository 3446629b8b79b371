"""The video contract of the rewards, and image rewards applied to videos frame by frame.

A video completion is its frames: a tensor [T, C, H, W] (float in [0, 1], or uint8 in 0..255;
C = 3, or 1 for grey) or a list of PIL images. An image completion (one PIL image) is a video of
one frame. A video with its sound is {"frames": the frames, "array": float32 [S] samples,
"sampling_rate": their rate}: the video rewards read its frames, the audio rewards its sound.
Beside the completion a reward may read the columns ``fps`` (frames per second of each row's video)
and, for image-to-video, ``image`` (the conditioning image).

`per_frame` turns a reward of images into one of images and videos: with ``frames`` (which
frames are scored: ``all``, ``first``, ``middle``, ``last`` or ``every_K``, every K-th frame from
the first) and ``aggregate`` (how their scores make the video's: ``mean``, ``min``, ``max``,
``median``), a video's chosen frames are scored as images (with their row's prompt and columns)
and aggregated. A frame scored None is left out; a video with no scored frame gets None.
"""

from __future__ import annotations

import functools
import inspect
import re
import statistics
from typing import Any, Callable, Literal, Sequence, get_args

import numpy as np
import torch
from torch import Tensor

FrameAggregation = Literal["mean", "min", "max", "median"]
FRAME_AGGREGATIONS: dict[str, Callable[[list[float]], float]] = dict(zip(get_args(FrameAggregation), (
    statistics.fmean, min, max, statistics.median)))
Frames = Literal["all", "first", "middle", "last", "every_K"]  # every_K: every K-th frame, K a whole number >= 1
FRAME_CHOICES = "all, first, middle, last or every_K (K >= 1)"


def video_part(completion: Any) -> Any:
    """The frames of a completion: those of a video with its sound, else the completion itself."""
    return completion["frames"] if isinstance(completion, dict) and "frames" in completion else completion


def is_video(completion: Any) -> bool:
    """A [T, C, H, W] tensor or array, or a list / tuple of frames (or a video with its sound)."""
    completion = video_part(completion)
    if isinstance(completion, (Tensor, np.ndarray)):
        return completion.ndim == 4
    return isinstance(completion, (list, tuple))


def frame_tensor(video: Any) -> Tensor:
    """The video as float32 [T, C, H, W] in [0, 1] (a single PIL image is one frame)."""
    video = video_part(video)
    if isinstance(video, (list, tuple)):
        return torch.stack([frame_tensor(frame)[0] for frame in video])
    if isinstance(video, (Tensor, np.ndarray)):
        frames = torch.as_tensor(video)
        if frames.ndim != 4:
            raise ValueError(f"a video tensor must be [T, C, H, W]; got shape {tuple(frames.shape)}")
        return frames.float() / 255.0 if frames.dtype == torch.uint8 else frames.float()
    array = np.asarray(video.convert("RGB"), dtype=np.float32) / 255.0  # a PIL image: [H, W, 3]
    return torch.from_numpy(array).permute(2, 0, 1)[None]


def pil_frames(video: Any) -> list:
    """The video's frames as 8-bit RGB PIL images."""
    from PIL import Image
    video = video_part(video)
    if isinstance(video, (list, tuple)):
        return [frame if isinstance(frame, Image.Image) else pil_frames(frame)[0] for frame in video]
    if not isinstance(video, (Tensor, np.ndarray)):
        return [video]
    frames = frame_tensor(video)
    if frames.shape[1] == 1:
        frames = frames.expand(-1, 3, -1, -1)
    pixels = (frames.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(p) for p in pixels]


def frame_indices(num_frames: int, frames: str) -> list[int]:
    """Which of `num_frames` frames `frames` names (see the module docstring)."""
    if num_frames < 1:
        raise ValueError("a video needs at least one frame")
    every = re.fullmatch(r"every_(\d+)", str(frames))
    if every and int(every.group(1)) >= 1:
        return list(range(0, num_frames, int(every.group(1))))
    named = {"all": list(range(num_frames)), "first": [0], "middle": [(num_frames - 1) // 2],
             "last": [num_frames - 1]}
    if frames not in named:
        raise ValueError(f"frames={frames!r} is not one of {FRAME_CHOICES}")
    return named[frames]


def check_frame_args(frames: str, aggregate: str) -> None:
    frame_indices(1, frames)
    if aggregate not in FRAME_AGGREGATIONS:
        raise ValueError(f"aggregate={aggregate!r} is not one of {', '.join(FRAME_AGGREGATIONS)}")


def score_frames(image_reward: Callable, prompts: Sequence[Any], completions: Sequence[Any],
                 columns: dict[str, Sequence[Any]], frames: str, aggregate: str) -> list[float | None]:
    """`image_reward` on the chosen frames of every video, called once on all of them (each
    frame with its row's prompt and columns), aggregated per video."""
    check_frame_args(frames, aggregate)
    owners, images = [], []
    for row, completion in enumerate(completions):
        all_frames = pil_frames(completion)
        for i in frame_indices(len(all_frames), frames):
            owners.append(row)
            images.append(all_frames[i])
    scores = image_reward([prompts[r] for r in owners], images,
                          **{k: [v[r] for r in owners] for k, v in columns.items()})
    per_row: list[list[float]] = [[] for _ in completions]
    for row, score in zip(owners, scores):
        if score is not None:
            per_row[row].append(float(score))
    return [FRAME_AGGREGATIONS[aggregate](s) if s else None for s in per_row]


def per_frame(columns: Sequence[str] = ()) -> Callable[[Callable], Callable]:
    """Make an image reward ``fn(prompts, completions, **kwargs)`` take videos too, with the
    arguments ``frames`` and ``aggregate``; images pass straight through. `columns` names the data
    columns the reward reads (one value per row, repeated for each frame of the row); its other
    keyword arguments are recipe arguments, passed as they are, and the data columns it does not
    name are not passed for videos."""
    def decorator(image_reward: Callable) -> Callable:
        @functools.wraps(image_reward)
        def reward(prompts, completions, *, frames: Frames = "all", aggregate: FrameAggregation = "mean", **kwargs):
            if not any(is_video(c) for c in completions):
                check_frame_args(frames, aggregate)
                return image_reward(prompts, completions, **kwargs)
            accepted = _named_parameters(image_reward)
            args = {k: v for k, v in kwargs.items() if k in accepted and k not in columns}
            read = {k: v for k, v in kwargs.items() if k in columns}
            return score_frames(functools.partial(image_reward, **args), prompts, completions, read,
                                frames, aggregate)
        reward.__signature__ = _with_frame_arguments(inspect.signature(image_reward, eval_str=True))
        return reward
    return decorator


def _with_frame_arguments(signature: inspect.Signature) -> inspect.Signature:
    """`signature` with the keyword-only ``frames="all"`` and ``aggregate="mean"`` before its **kwargs."""
    params = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
    rest = [p for p in signature.parameters.values() if p.kind == p.VAR_KEYWORD]
    added = [inspect.Parameter("frames", inspect.Parameter.KEYWORD_ONLY, default="all", annotation=Frames),
             inspect.Parameter("aggregate", inspect.Parameter.KEYWORD_ONLY, default="mean",
                               annotation=FrameAggregation)]
    return signature.replace(parameters=params + added + rest)


def _named_parameters(fn: Callable) -> set[str]:
    return {name for name, p in inspect.signature(fn).parameters.items() if p.kind != p.VAR_KEYWORD}
