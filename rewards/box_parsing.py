"""Reading boxes out of a model's text (`parse_boxes`) and out of a ground-truth column
(`truth_boxes`); writing them as a model would (`format_boxes`).

Boxes are ``[x1, y1, x2, y2]`` floats with x1 <= x2, y1 <= y2. A model writes them as plain lists,
Qwen2.5-VL ``bbox_2d`` JSON, Qwen-VL ``<box>(x1,y1),(x2,y2)</box>`` or
``<|box_start|>...<|box_end|>``, in its own coordinates (`rewards.box_frames` brings them to
the image's pixels). The `iou` reward scores them (`rewards.iou`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from .box_frames import NUMBER_PATTERN, Box, check_coords, coords_scale, finite_number, scale_boxes
from .text import completion_text, extract_answer

STYLES = ("list", "bbox_2d", "qwen_box", "box_token")
BOX_KEYS = ("bbox_2d", "bbox", "box")

_NUMBER = re.compile(NUMBER_PATTERN)
_TAGGED = re.compile(r"<box>([^<>]*)</box>|<\|box_start\|>([^<>]*)<\|box_end\|>")
_PLAIN_LIST = re.compile(r"\[\s*" + r"\s*,\s*".join([f"({NUMBER_PATTERN})"] * 4) + r"\s*,?\s*\]")
_MAX_DEPTH = 16
_MAX_JSON_FAILURES = 256  # bounds the JSON scan on adversarial text; plain lists are still read by regex


def _ordered(values: Sequence[Any]) -> Box | None:
    """[min x, min y, max x, max y] from four numbers; None when any is not a finite number."""
    if len(values) != 4:
        return None
    nums = [finite_number(v) for v in values]
    if any(n is None for n in nums):
        return None
    x1, y1, x2, y2 = nums
    return [min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)]


def _boxes_from_string(s: str) -> list[Box]:
    """Groups of four numbers in a string such as ``(10,20),(30,40)``."""
    nums = _NUMBER.findall(s)
    if not nums or len(nums) % 4:
        return []
    out = []
    for k in range(0, len(nums), 4):
        box = _ordered(nums[k:k + 4])
        if box is not None:
            out.append(box)
    return out


def _box_value(v: Any, depth: int) -> list[Box]:
    """The box(es) under a ``bbox_2d``/``bbox``/``box`` key."""
    if isinstance(v, str):
        return _boxes_from_string(v)
    return _walk(v, depth + 1)


def _walk(obj: Any, depth: int = 0) -> list[Box]:
    """Boxes in a decoded JSON value: four-number lists, ``[[x1, y1], [x2, y2]]``, objects with a box
    key (other keys ignored), objects without one searched value by value, lists of any of those."""
    if depth > _MAX_DEPTH:
        return []
    if isinstance(obj, dict):
        for key in BOX_KEYS:
            if key in obj:
                return _box_value(obj[key], depth)
        out = []
        for v in obj.values():
            if isinstance(v, (dict, list)):
                out.extend(_walk(v, depth + 1))
        return out
    if isinstance(obj, list):
        if len(obj) == 4 and not any(isinstance(v, (list, dict)) for v in obj):
            box = _ordered(obj)
            return [box] if box is not None else []
        if (len(obj) == 2 and all(isinstance(p, list) and len(p) == 2 for p in obj)
                and not any(isinstance(v, (list, dict)) for p in obj for v in p)):
            box = _ordered([obj[0][0], obj[0][1], obj[1][0], obj[1][1]])
            return [box] if box is not None else []
        out = []
        for v in obj:
            if isinstance(v, (dict, list)):
                out.extend(_walk(v, depth + 1))
        return out
    return []


def _blank(text: str, start: int, end: int) -> str:
    return text[:start] + " " * (end - start) + text[end:]


def _parse_segment(text: str) -> list[Box]:
    """Boxes in `text`, in the order they appear, in the model's own coordinates."""
    found: list[tuple[int, Box]] = []
    # 1. tagged forms; blanked out so their contents are not read twice
    for m in _TAGGED.finditer(text):
        found.extend((m.start(), b) for b in _boxes_from_string(m.group(1) if m.group(1) is not None
                                                               else m.group(2)))
    text = _TAGGED.sub(lambda m: " " * len(m.group(0)), text)
    # 2. JSON values (fenced or not) starting at each '[' or '{'
    decoder = json.JSONDecoder(parse_int=float)
    i = failures = 0
    while failures < _MAX_JSON_FAILURES:
        starts = [p for p in (text.find("[", i), text.find("{", i)) if p >= 0]
        if not starts:
            break
        i = min(starts)
        try:
            obj, end = decoder.raw_decode(text, i)
        except RecursionError:  # too deep: the brackets nested inside fail the same way
            failures += 1
            while i < len(text) and text[i] in "[{ \t\r\n":
                i += 1
            continue
        except (ValueError, OverflowError):
            failures += 1
            i += 1
            continue
        found.extend((i, b) for b in _walk(obj))
        text = _blank(text, i, end)
        i = end
    # 3. four-number lists JSON refused (trailing comma, ...)
    for m in _PLAIN_LIST.finditer(text):
        box = _ordered(m.groups())
        if box is not None:
            found.append((m.start(), box))
    found.sort(key=lambda t: t[0])
    return [b for _, b in found]


def raw_boxes(text: Any) -> list[Box]:
    """Boxes in the model's coordinates, from the last ``<answer>`` block when it holds any, else
    from the whole text. Never raises."""
    try:
        if not isinstance(text, str):
            text = completion_text(text)
        answer = extract_answer(text)
        if answer is not None:
            boxes = _parse_segment(answer)
            if boxes:
                return boxes
        return _parse_segment(text)
    except Exception:  # parsing arbitrary model output must never break a training step
        return []


def parse_boxes(text: Any, coords: str = "pixels", image_size: Sequence[float] | None = None) -> list[Box]:
    """Boxes ``[x1, y1, x2, y2]`` in absolute pixels from a model's output.

    Reads plain lists (``[x1, y1, x2, y2]``, several, or a list of lists), JSON objects or lists of
    objects with a ``bbox_2d`` (Qwen2.5-VL), ``bbox`` or ``box`` key (inside ```json fences or not),
    ``<box>(x1,y1),(x2,y2)</box>`` (Qwen-VL) and ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``. The last
    ``<answer>...</answer>`` block is read first; the whole text when it holds no box.

    `coords` is the model's scale: "pixels" (absolute), "norm1" (0-1: x * width, y * height) or
    "norm1000" (0-1000: x * width / 1000, y * height / 1000), with ``image_size = [width, height]``.
    Corners are reordered (x1 <= x2, y1 <= y2); boxes with a NaN, an infinity or a non-numeric entry
    are dropped. Never raises on the text; raises ValueError for an unknown `coords`, or normalised
    coords without a valid `image_size`.
    """
    size = check_coords(coords, image_size)
    return scale_boxes(raw_boxes(text), coords_scale(coords, size))


def _fmt(x: float) -> str:
    x = float(x)
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


def format_boxes(boxes: Sequence[Sequence[float]], style: str = "list") -> str:
    """Boxes written as a model would: "list" (``[x1, y1, x2, y2]``, or a list of lists for several),
    "bbox_2d" (a ```json fenced list of ``{"bbox_2d": [...]}`` objects, Qwen2.5-VL), "qwen_box"
    (``<box>(x1,y1),(x2,y2)</box>``, Qwen-VL) or "box_token" (``<|box_start|>...<|box_end|>``).
    `parse_boxes` reads every style back to the same floats."""
    rows = [[_fmt(v) for v in b] for b in boxes]
    if style == "list":
        lists = ["[" + ", ".join(r) + "]" for r in rows]
        return lists[0] if len(lists) == 1 else "[" + ", ".join(lists) + "]"
    if style == "bbox_2d":
        objs = ", ".join('{"bbox_2d": [' + ", ".join(r) + "]}" for r in rows)
        return "```json\n[" + objs + "]\n```"
    if style == "qwen_box":
        return "".join(f"<box>({r[0]},{r[1]}),({r[2]},{r[3]})</box>" for r in rows)
    if style == "box_token":
        return "".join(f"<|box_start|>({r[0]},{r[1]}),({r[2]},{r[3]})<|box_end|>" for r in rows)
    raise ValueError(f"format_boxes: style={style!r} is not one of {STYLES}")


def truth_boxes(row: Any, i: int) -> list[Box]:
    """A ground-truth ``boxes`` value: a list of ``[x1, y1, x2, y2]`` boxes or one box, or either
    written as JSON text, optionally inside ``<answer>...</answer>`` (the last block), as R1-V's and
    VLM-R1's solutions are (``"<answer>[38, 53, 71, 86]</answer>"``). ValueError naming row `i`."""
    value = _decoded(row) if isinstance(row, str) else row
    if isinstance(value, (list, tuple)) and len(value) == 4 and all(finite_number(v) is not None for v in value):
        value = [value]
    try:
        out = [_ordered(list(b)) for b in value]
    except TypeError:
        out = [None]
    if any(b is None for b in out):
        raise ValueError(f"iou: column 'boxes' row {i} is {row!r:.200}; expected a list of [x1, y1, x2, y2] "
                         f"boxes of finite numbers (or that list as text, optionally inside <answer>...</answer>), "
                         f"or None")
    return out


def _decoded(text: str) -> Any:
    """The JSON value in the last ``<answer>`` block of `text`, else in `text`; None when it is not JSON."""
    answer = extract_answer(text)
    try:
        return json.loads(answer if answer is not None else text)
    except (ValueError, RecursionError):
        return None
