"""Box IoU reward for grounding / detection.

Boxes are ``[x1, y1, x2, y2]`` in the original image's pixels once parsed. The model's output is
parsed by `parse_boxes` from the forms vision-language models emit (plain lists, Qwen2.5-VL
``bbox_2d`` JSON, Qwen-VL ``<box>(x1,y1),(x2,y2)</box>``, ``<|box_start|>...<|box_end|>``), brought
to the image's frame (``frame``: "image" pixels, "input" pixels of the processor's resized image
as Qwen2.5-VL answers, "normalized_1000" as Qwen3-VL answers; or the older ``coords``), and
scored against the ``boxes`` column:

  IoU(a, b) = |a ∩ b| / |a ∪ b|          (0 when the union has zero area)

Predictions and ground truths are paired (``match``): "hungarian" one-to-one maximising the
summed IoU (``scipy.optimize.linear_sum_assignment``), "greedy" in emission order, or "first"
(first box against first box). With P predicted and G true boxes and matched pairs M:

  mode="mean_iou"   r = sum_{(p,g) in M, IoU > threshold} IoU(p, g) / max(P, G)
      Each extra or missing box adds a zero to the average, so it costs. With one box each and
      threshold 0 this is the plain IoU; it is NOT VLM-R1's or Visual-RFT's reward in general.
  mode="detection"  TP = #{(p,g) in M : IoU(p, g) >= iou_threshold},
                    r = F1 = 2 * precision * recall / (precision + recall) = 2 TP / (P + G)

Both are 1.0 when P = G = 0 (the model correctly reports no box for an image with none).

The peers' own rules are the presets (`rewards.iou_presets`):
  preset="vlm_r1"      VLM-R1 (Shen et al. 2025, arXiv:2504.07615) REC reward: the first box of
      the first ``<answer>``, rescaled from the input frame to the image's, IoU with overlaps of
      1 px or less counted as none; the truth from the solution's last ``<answer>``.
  preset="visual_rft"  Visual-RFT (Liu et al. 2025, arXiv:2503.01785) detection IoU reward:
      ``{'Position', 'Confidence'}`` lists, greedy matching by decreasing confidence, a match
      counted only above IoU 0.5, sum / max(G, P).

A completion with no parsable box scores 0.0 (reason ``no_box``); one whose coordinates lie outside
the declared range (e.g. pixels emitted where ``coords="norm1000"`` was declared) scores 0.0
(reason ``bad_coords``). The counts are reported through the per-call `log_metric` and logged by the engine
as ``reward/iou/unparsable/<reason>``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from mmrl.core.scoring import register_reward

from .iou_presets import math_verify_equal, visual_rft_score, visual_rft_truth, vlm_r1_score, vlm_r1_truth
from .text import completion_text, extract_answer

COORDS = ("pixels", "norm1", "norm1000")
FRAMES = ("image", "input", "normalized_1000")
MATCHES = ("hungarian", "greedy", "first")
PRESETS = ("vlm_r1", "visual_rft")
MODES = ("mean_iou", "detection")
STYLES = ("list", "bbox_2d", "qwen_box", "box_token")
BOX_KEYS = ("bbox_2d", "bbox", "box")
RANGE_SLACK = 0.01  # a coordinate may overshoot its declared range by 1% of the range

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_NUMBER = re.compile(_NUM)
_TAGGED = re.compile(r"<box>([^<>]*)</box>|<\|box_start\|>([^<>]*)<\|box_end\|>")
_PLAIN_LIST = re.compile(r"\[\s*(" + _NUM + r")\s*,\s*(" + _NUM + r")\s*,\s*(" + _NUM + r")\s*,\s*("
                         + _NUM + r")\s*,?\s*\]")
_MAX_DEPTH = 16
_MAX_JSON_FAILURES = 256  # bounds the JSON scan on adversarial text; plain lists are still read by regex


Box = list[float]


# ---------------------------------------------------------------------------------------------
# parsing


def _number(v: Any) -> float | None:
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


def _ordered(values: Sequence[Any]) -> Box | None:
    """[min x, min y, max x, max y] from four numbers; None when any is not a finite number."""
    if len(values) != 4:
        return None
    nums = [_number(v) for v in values]
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


def _raw_boxes(text: Any) -> list[Box]:
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


def _check_coords(coords: str, image_size: Any) -> tuple[float, float] | None:
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


def _extent(coords: str, size: tuple[float, float] | None) -> tuple[float, float] | None:
    """The declared range of x and y in the model's coordinates (None: unknown)."""
    if coords == "norm1":
        return 1.0, 1.0
    if coords == "norm1000":
        return 1000.0, 1000.0
    return size


def _scale(boxes: list[Box], coords: str, size: tuple[float, float] | None) -> list[Box]:
    if coords == "pixels":
        return boxes
    w, h = size
    if coords == "norm1000":
        w, h = w / 1000.0, h / 1000.0
    return [[b[0] * w, b[1] * h, b[2] * w, b[3] * h] for b in boxes]


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
    size = _check_coords(coords, image_size)
    return _scale(_raw_boxes(text), coords, size)


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


# ---------------------------------------------------------------------------------------------
# scoring


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """|a ∩ b| / |a ∪ b| for ``[x1, y1, x2, y2]`` boxes; 0.0 when the union has zero area."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, iw) * max(0.0, ih)
    area_a = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1])
    area_b = max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])
    union = area_a + area_b - inter
    if union <= 0:
        return 0.0
    return float(min(1.0, max(0.0, inter / union)))


def match_boxes(pred: Sequence[Sequence[float]], truth: Sequence[Sequence[float]]) -> list[tuple[int, int, float]]:
    """One-to-one pairs (pred index, truth index, IoU) maximising the summed IoU (Hungarian algorithm,
    ``scipy.optimize.linear_sum_assignment``); min(#pred, #truth) pairs, sorted by pred index."""
    if len(pred) == 0 or len(truth) == 0:
        return []
    ious = np.array([[box_iou(p, t) for t in truth] for p in pred], dtype=np.float64)
    rows, cols = linear_sum_assignment(ious, maximize=True)
    return sorted((int(i), int(j), float(ious[i, j])) for i, j in zip(rows, cols))


def greedy_match(pred: Sequence[Sequence[float]], truth: Sequence[Sequence[float]]) -> list[tuple[int, int, float]]:
    """Pairs (pred index, truth index, IoU): predictions in order, each taking the still unmatched
    truth box of highest IoU (ties: the first); a prediction overlapping none is left unpaired."""
    taken: set[int] = set()
    pairs = []
    for i, p in enumerate(pred):
        best, best_iou = -1, 0.0
        for j, t in enumerate(truth):
            if j not in taken:
                iou = box_iou(p, t)
                if iou > best_iou:
                    best, best_iou = j, iou
        if best >= 0:
            taken.add(best)
            pairs.append((i, best, best_iou))
    return pairs


def score_boxes(pred: Sequence[Sequence[float]], truth: Sequence[Sequence[float]], mode: str = "mean_iou",
                iou_threshold: float = 0.5, match: str = "hungarian", threshold: float = 0.0) -> float:
    """mean_iou: sum of matched IoUs above `threshold` / max(P, G); detection: F1 = 2 TP / (P + G)
    at `iou_threshold`. `match`: hungarian (`match_boxes`), greedy (`greedy_match`), first (only
    the first predicted and the first true box, P = G = 1). 1.0 when both are empty."""
    if mode not in MODES:
        raise ValueError(f"iou: mode={mode!r} is not one of {MODES}")
    if not pred and not truth:
        return 1.0
    if match == "first":
        pred, truth = list(pred[:1]), list(truth[:1])
        pairs = [(0, 0, box_iou(pred[0], truth[0]))] if pred and truth else []
    else:
        pairs = greedy_match(pred, truth) if match == "greedy" else match_boxes(pred, truth)
    if mode == "mean_iou":
        return sum(iou for _, _, iou in pairs if iou > threshold) / max(len(pred), len(truth))
    tp = sum(1 for _, _, iou in pairs if iou >= iou_threshold)
    return 2.0 * tp / (len(pred) + len(truth))


def _in_range(boxes: list[Box], extent: tuple[float, float] | None) -> bool:
    if extent is None:
        return True
    w, h = extent
    return all(-RANGE_SLACK * w <= b[0] and b[2] <= (1 + RANGE_SLACK) * w
               and -RANGE_SLACK * h <= b[1] and b[3] <= (1 + RANGE_SLACK) * h for b in boxes)


def _truth_boxes(row: Any, i: int) -> list[Box]:
    """A ``boxes`` row: a list of boxes, or one bare box."""
    if isinstance(row, (list, tuple)) and len(row) == 4 and all(_number(v) is not None for v in row):
        row = [row]
    try:
        out = [_ordered(list(b)) for b in row]
    except TypeError:
        out = [None]
    if any(b is None for b in out):
        raise ValueError(f"iou: column 'boxes' row {i} is {row!r:.200}; expected a list of "
                         f"[x1, y1, x2, y2] boxes of finite numbers, or None")
    return out


def _row_sizes(image_size: Any, n: int, name: str = "image_size") -> list[Any]:
    if image_size is None:
        return [None] * n
    if (isinstance(image_size, (list, tuple)) and len(image_size) == 2
            and all(_number(v) is not None for v in image_size)):
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
    w, h = _check_coords("pixels", value)
    return w, h


def _frame_scale(frame: str, original: Any, input_size: Any, i: int) -> tuple[float, float] | None:
    """(x, y) factors from the model's frame to the original image's pixels (None: already there)."""
    if frame == "image":
        return None
    w, h = _size(original, "original_size", frame, i)
    if frame == "normalized_1000":
        return w / 1000.0, h / 1000.0
    iw, ih = _size(input_size, "input_size", frame, i)
    return w / iw, h / ih


def _frame_extent(frame: str, original: Any, input_size: Any) -> tuple[float, float] | None:
    if frame == "normalized_1000":
        return 1000.0, 1000.0
    size = original if frame == "image" else input_size
    return None if size is None else tuple(float(v) for v in size)


@register_reward("iou")
def iou_reward(prompts, completions, boxes, coords: str = "pixels", image_size=None, mode: str = "mean_iou",
               iou_threshold: float = 0.5, frame: str | None = None, match: str = "hungarian",
               threshold: float = 0.0, preset: str | None = None, original_size=None, input_size=None,
               math_verify_first: bool = False, log_metric=None, **kwargs) -> list[float | None]:
    """Box reward in [0, 1] against the ``boxes`` column (per row a list of ``[x1, y1, x2, y2]`` in
    the ORIGINAL image's pixels, or None: not applicable -> None; bind another column with
    ``rewards.iou.columns: {boxes: solution}``).

    Frame of the prediction: ``frame`` (takes precedence over ``coords``) is "image" (pixels of
    the original image: no rescaling), "input" (pixels of the image as the processor resized it,
    Qwen2.5-VL: x * W / W_input, y * H / H_input) or "normalized_1000" (0-1000, Qwen3-VL:
    x * W / 1000, y * H / 1000); W, H from the ``original_size`` column and W_input, H_input from
    ``input_size`` (both [width, height], passed per row by the vlm adapter). Without ``frame``,
    ``coords`` / ``image_size`` as in `parse_boxes` (``image_size`` per row, or one [width, height]).

    Matching (``match``): "hungarian" (one-to-one, maximum summed IoU), "greedy" (predictions in
    emission order, each taking the unmatched truth box of highest IoU), "first" (only the first
    predicted box against the first true box). mode="mean_iou": sum of matched IoUs greater than
    ``threshold`` / max(#pred, #truth); mode="detection": F1 = 2 TP / (#pred + #truth), TP =
    matched pairs with IoU >= iou_threshold. Neither alone is the peers' reward: ``preset``
    "vlm_r1" (default frame "input") and "visual_rft" (frame "image") reproduce VLM-R1's and
    Visual-RFT's reward code, answer formats included (`rewards.iou_presets`); they ignore
    ``match``, ``mode`` and ``threshold`` (Visual-RFT's 0.5 is fixed); ``math_verify_first`` adds
    Visual-RFT's math_verify shortcut (off by default: it pays 1.0 for coinciding first numbers).
    No parsable box -> 0.0 (``no_box``); a coordinate outside the declared range (0-1, 0-1000, the
    input or the image for pixels with a size; 1% slack) -> 0.0 (``bad_coords``); each counted through
    `log_metric` as ``unparsable/<reason>`` (the engine logs ``reward/iou/unparsable/<reason>``).
    """
    if mode not in MODES:
        raise ValueError(f"iou: mode={mode!r} is not one of {MODES}")
    if not 0.0 < float(iou_threshold) <= 1.0:
        raise ValueError(f"iou: iou_threshold={iou_threshold!r} must be in (0, 1]")
    if coords not in COORDS:
        raise ValueError(f"iou: coords={coords!r} is not one of {COORDS}")
    if frame is not None and frame not in FRAMES:
        raise ValueError(f"iou: frame={frame!r} is not one of {FRAMES}")
    if match not in MATCHES:
        raise ValueError(f"iou: match={match!r} is not one of {MATCHES}")
    if not 0.0 <= float(threshold) < 1.0:
        raise ValueError(f"iou: threshold={threshold!r} must be in [0, 1)")
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"iou: preset={preset!r} is not one of {PRESETS}")
    n = len(completions)
    if len(boxes) != n:
        raise ValueError(f"iou: column 'boxes' has {len(boxes)} values for {n} completions")
    if preset is not None or frame is not None:
        originals = _row_sizes(original_size if original_size is not None else image_size, n, "original_size")
        inputs = _row_sizes(input_size, n, "input_size")
    if preset is not None:
        return _preset_rewards(preset, frame, completions, boxes, originals, inputs, math_verify_first)
    sizes = _row_sizes(image_size, n)
    log_metric = log_metric or (lambda key, value=1.0: None)  # called outside the engine: not counted
    out: list[float | None] = []
    for i, (completion, row) in enumerate(zip(completions, boxes)):
        if row is None:
            out.append(None)
            continue
        truth = _truth_boxes(row, i)
        if frame is None:
            size = _check_coords(coords, sizes[i])
            extent, scale = _extent(coords, size), None
        else:
            extent, scale = _frame_extent(frame, originals[i], inputs[i]), _frame_scale(frame, originals[i], inputs[i], i)
        raw = _raw_boxes(completion_text(completion))
        if not raw:
            if not truth:
                out.append(1.0)  # no box expected, none given
                continue
            log_metric("unparsable/no_box")
            out.append(0.0)
            continue
        if not _in_range(raw, extent):
            log_metric("unparsable/bad_coords")
            out.append(0.0)
            continue
        if frame is None:
            pred = _scale(raw, coords, size)
        else:
            sx, sy = scale or (1.0, 1.0)
            pred = [[b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy] for b in raw]
        out.append(score_boxes(pred, truth, mode, iou_threshold, match, threshold))
    return out


def _preset_rewards(preset: str, frame: str | None, completions, boxes, originals, inputs,
                    math_verify_first: bool) -> list[float | None]:
    frame = frame or ("input" if preset == "vlm_r1" else "image")
    out: list[float | None] = []
    for i, (completion, row) in enumerate(zip(completions, boxes)):
        if row is None:
            out.append(None)
            continue
        text = completion_text(completion)
        if preset == "vlm_r1":
            out.append(vlm_r1_score(text, vlm_r1_truth(row, i), _frame_scale(frame, originals[i], inputs[i], i)))
        else:
            if frame != "image":
                raise ValueError(f"iou: preset='visual_rft' reads boxes in the image's frame; frame={frame!r}")
            truth = visual_rft_truth(row, i)
            out.append(1.0 if math_verify_first and math_verify_equal(text, row)
                       else visual_rft_score(text, truth))
    return out

