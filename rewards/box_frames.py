"""Coordinate frames of boxes: from the scale or frame a model answers in to the original image's
pixels, and the range its coordinates must lie in.

``coords`` (the scale, with one ``image_size`` = [width, height]): "pixels" (absolute), "norm1"
(0-1: x * width, y * height), "norm1000" (0-1000: x * width / 1000, y * height / 1000).
``frame`` (per row, with the ``original_size`` and ``input_size`` columns the vlm adapter
passes): "image" (the original image's pixels), "input" (pixels of the image as the processor
resized it, Qwen2.5-VL: x * W / W_input, y * H / H_input), "normalized_1000" (Qwen3-VL: x * W /
1000, y * H / 1000). A coordinate may overshoot its range by `RANGE_SLACK` of the range.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, get_args

Coords = Literal["pixels", "norm1", "norm1000"]
Frame = Literal["image", "input", "normalized_1000"]
COORDS, FRAMES = get_args(Coords), get_args(Frame)
RANGE_SLACK = 0.01  # a coordinate may overshoot its declared range by 1% of the range

NUMBER_PATTERN = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"  # a decimal number, sign and exponent optional
_NUMBER = re.compile(NUMBER_PATTERN)

Box = list[float]


def finite_number(v: Any) -> float | None:
    """A finite float from a number or a numeric string; None otherwise (bool is not a number)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        try:
            f = float(v)
        except (OverflowError, ValueError):
            return None
    elif isinstance(v, str) and _NUMBER.fullmatch(v.strip()):
        try:
            f = float(v.strip())
        except (OverflowError, ValueError):
            return None
    else:
        return None
    return f if math.isfinite(f) else None


def check_coords(coords: str, image_size: Any) -> tuple[float, float] | None:
    """`image_size` as (width, height) floats (None without one); an error for an unknown `coords`,
    normalised coords without a size, or a size that is not two positive finite numbers."""
    if coords not in COORDS:
        raise ValueError(f"iou: coords={coords!r} is not one of {COORDS}")
    if image_size is None:
        if coords != "pixels":
            raise ValueError(f"iou: coords={coords!r} are normalised and need image_size=[width, height] "
                             f"(the `image_size` column) to be scaled to pixels")
        return None
    try:
        w, h = (float(v) for v in image_size)
    except (TypeError, ValueError):
        raise ValueError(f"iou: image_size={image_size!r} is not [width, height]") from None
    if not (math.isfinite(w) and math.isfinite(h) and w > 0 and h > 0):
        raise ValueError(f"iou: image_size={image_size!r} must be two positive finite numbers")
    return w, h


def coords_extent(coords: str, size: tuple[float, float] | None) -> tuple[float, float] | None:
    """The declared range of x and y in the model's coordinates (None: unknown)."""
    if coords == "norm1":
        return 1.0, 1.0
    if coords == "norm1000":
        return 1000.0, 1000.0
    return size


def coords_scale(coords: str, size: tuple[float, float] | None) -> tuple[float, float] | None:
    """(x, y) factors from `coords` to pixels of an image of `size` (width, height); None for pixels."""
    if coords == "pixels":
        return None
    w, h = size
    if coords == "norm1000":
        return w / 1000.0, h / 1000.0
    return w, h


def scale_boxes(boxes: list[Box], scale: tuple[float, float] | None) -> list[Box]:
    """Boxes with x multiplied by scale[0] and y by scale[1] (unchanged for None)."""
    if scale is None:
        return boxes
    sx, sy = scale
    return [[b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy] for b in boxes]


def in_range(boxes: list[Box], extent: tuple[float, float] | None) -> bool:
    """Whether every box lies within [0, width] x [0, height] of `extent`, `RANGE_SLACK` allowed
    (True when the extent is unknown)."""
    if extent is None:
        return True
    w, h = extent
    return all(-RANGE_SLACK * w <= b[0] and b[2] <= (1 + RANGE_SLACK) * w
               and -RANGE_SLACK * h <= b[1] and b[3] <= (1 + RANGE_SLACK) * h for b in boxes)


def row_sizes(image_size: Any, n: int, name: str = "image_size") -> list[Any]:
    """One [width, height] (or None) per row: the column's values, or one size given for all rows."""
    if image_size is None:
        return [None] * n
    if (isinstance(image_size, (list, tuple)) and len(image_size) == 2
            and all(finite_number(v) is not None for v in image_size)):
        return [image_size] * n  # one size for every row (a recipe argument)
    sizes = list(image_size)
    if len(sizes) != n:
        raise ValueError(f"iou: column {name!r} has {len(sizes)} values for {n} completions")
    return sizes


def _size(value: Any, name: str, frame: str, i: int) -> tuple[float, float]:
    """A row's [width, height] as two positive floats; an error naming the column when absent."""
    if value is None:
        raise ValueError(f"iou: frame={frame!r} needs the {name!r} column ([width, height]; the vlm adapter "
                         f"passes original_size and input_size), row {i} has none")
    w, h = check_coords("pixels", value)
    return w, h


def frame_scale(frame: str, original: Any, input_size: Any, i: int) -> tuple[float, float] | None:
    """(x, y) factors from the model's frame to the original image's pixels (None: already there)."""
    if frame == "image":
        return None
    w, h = _size(original, "original_size", frame, i)
    if frame == "normalized_1000":
        return w / 1000.0, h / 1000.0
    iw, ih = _size(input_size, "input_size", frame, i)
    return w / iw, h / ih


def frame_extent(frame: str, original: Any, input_size: Any) -> tuple[float, float] | None:
    """The range of x and y in `frame` (None: unknown)."""
    if frame == "normalized_1000":
        return 1000.0, 1000.0
    size = original if frame == "image" else input_size
    return None if size is None else tuple(float(v) for v in size)
