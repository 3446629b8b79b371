"""The built-in image and video tools: `crop` / `zoom` (a region of an image, returned as a new
image) and `select_frames` (frames of a video, returned as images).

A box is read in the frame `policy.episode.box_frame` sets, the frames of the IoU reward
(`rewards.box_frames`): "image" (the original image's pixels), "input" (pixels of the image as
the processor resized it, Qwen2.5-VL's frame), "normalized_1000" (0-1000, Qwen3-VL's frame). It
is mapped to the original image's pixels and the region cut from the original image, so the
model reads the full-resolution detail; the crop re-enters the processor as an image of its own
(its own grid). A box that is not four numbers, reaches outside the frame by more than
`RANGE_SLACK` (1%), or is smaller than `MIN_SIDE` pixels is a tool error (the model reads why).
"""


import math
from typing import Any

from PIL import Image

from mmrl.rewards.box_frames import finite_number, frame_extent, frame_scale, in_range, scale_boxes

from .tools import EpisodeView, register_tool

MIN_SIDE = 4  # pixels of the original image a crop must span in each direction


def image_box(bbox_2d: Any, episode: EpisodeView, image_index: int) -> tuple[Image.Image, tuple[int, int, int, int]]:
    """The episode's image `image_index` and `bbox_2d` as an integer pixel box of it, checked."""
    if not isinstance(image_index, int) or not 0 <= image_index < len(episode.images):
        raise ValueError(f"image_index={image_index!r}: the episode has {len(episode.images)} image(s)")
    box = [finite_number(v) for v in bbox_2d] if isinstance(bbox_2d, (list, tuple)) else []
    if len(box) != 4 or any(v is None for v in box):
        raise ValueError(f"bbox_2d={bbox_2d!r} must be four numbers [x1, y1, x2, y2]")
    image = episode.images[image_index]
    frame = episode.box_frame
    original = list(image.size)
    input_size = episode.input_sizes[image_index] if image_index < len(episode.input_sizes) else None
    if frame == "input" and input_size is None:
        raise ValueError("the model's input frame of this image is unknown (box_frame 'input' needs a Qwen-VL processor)")
    if not in_range([box], frame_extent(frame, original, input_size)):
        raise ValueError(f"bbox_2d={bbox_2d!r} reaches outside the image (frame {frame!r})")
    x1, y1, x2, y2 = scale_boxes([box], frame_scale(frame, original, input_size, image_index))[0]
    w, h = original
    left, top = max(0, math.floor(x1 + 1e-6)), max(0, math.floor(y1 + 1e-6))
    right, bottom = min(w, math.ceil(x2 - 1e-6)), min(h, math.ceil(y2 - 1e-6))
    if right - left < MIN_SIDE or bottom - top < MIN_SIDE:
        raise ValueError(f"bbox_2d={bbox_2d!r} spans less than {MIN_SIDE} pixels of the image in width or height")
    return image, (left, top, right, bottom)


@register_tool("crop")
def crop(bbox_2d: list[float], episode: EpisodeView, image_index: int = 0) -> Image.Image:
    """Crop a region of an image and look at it at full resolution.

    Args:
        bbox_2d: the region's box [x1, y1, x2, y2] (left, top, right, bottom)
        image_index: which image of the conversation to crop (0: the first)
    """
    image, box = image_box(bbox_2d, episode, image_index)
    return image.crop(box)


register_tool("zoom")(crop)  # DeepEyes' and verl's name for the same tool (image_zoom_in_tool)


@register_tool("select_frames")
def select_frames(episode: EpisodeView, indices: list[int] | None = None, times: list[float] | None = None,
                  video_index: int = 0) -> list:
    """Look at chosen frames of a video as images.

    Args:
        indices: positions of the frames among the video's sampled frames (0: the first)
        times: times in seconds; the sampled frame nearest each is returned
        video_index: which video of the conversation (0: the first)
    """
    if not isinstance(video_index, int) or not 0 <= video_index < len(episode.videos):
        raise ValueError(f"video_index={video_index!r}: the episode has {len(episode.videos)} video(s)")
    if (indices is None) == (times is None):
        raise ValueError("give indices or times, one of them")
    frames = episode.videos[video_index]
    if times is not None:
        indices = [nearest_frame(t, episode, video_index) for t in times]
    if not indices or not all(isinstance(i, int) and 0 <= i < len(frames) for i in indices):
        raise ValueError(f"indices={indices!r}: the video has {len(frames)} frames (0 to {len(frames) - 1})")
    return [Image.fromarray(frames[i]).convert("RGB") for i in indices]


def nearest_frame(t: Any, episode: EpisodeView, video_index: int) -> int:
    """The sampled frame nearest `t` seconds (its source frame index / the source fps)."""
    seconds = finite_number(t)
    meta = episode.video_metadata[video_index] if video_index < len(episode.video_metadata) else None
    if seconds is None or seconds < 0:
        raise ValueError(f"times: {t!r} is not a time in seconds")
    if meta is None or not getattr(meta, "fps", None):
        raise ValueError("the video's frame times are unknown (no fps)")
    stamps = [i / meta.fps for i in meta.frames_indices]
    return min(range(len(stamps)), key=lambda k: abs(stamps[k] - seconds))

