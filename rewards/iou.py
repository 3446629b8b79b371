"""Box IoU reward for grounding / detection.

Boxes are ``[x1, y1, x2, y2]`` in the original image's pixels once parsed. The model's output is
parsed by `rewards.box_parsing.parse_boxes` from the forms vision-language models emit (plain lists, Qwen2.5-VL
``bbox_2d`` JSON, Qwen-VL ``<box>(x1,y1),(x2,y2)</box>``, ``<|box_start|>...<|box_end|>``), brought
to the image's frame (``frame``: "image" pixels, "input" pixels of the processor's resized image
as Qwen2.5-VL answers, "normalized_1000" as Qwen3-VL answers; or the older ``coords``;
`rewards.box_frames`), and scored against the ``boxes`` column (boxes, or that JSON text,
optionally inside ``<answer>...</answer>`` as R1-V and VLM-R1 write solutions):

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

from typing import Any, Literal, Sequence, get_args

import numpy as np
from scipy.optimize import linear_sum_assignment

from mmrl.core.scoring import register_reward

from .box_frames import (COORDS, FRAMES, Box, Coords, Frame, check_coords, coords_extent, coords_scale, frame_extent,
                         frame_scale, in_range, row_sizes, scale_boxes)
from .box_parsing import raw_boxes, truth_boxes
from .iou_presets import math_verify_equal, visual_rft_score, visual_rft_truth, vlm_r1_score, vlm_r1_truth
from .outputs import TEXT
from .text import completion_text

Match = Literal["hungarian", "greedy", "first"]
Preset = Literal["vlm_r1", "visual_rft"]
Mode = Literal["mean_iou", "detection"]
MATCHES, PRESETS, MODES = get_args(Match), get_args(Preset), get_args(Mode)
# what to write instead of a ground-truth value the reward cannot read, by preset
BOX_FORMS = {
    None: "the iou reward cannot read boxes from it: write [x1, y1, x2, y2] or a list of such boxes (as a "
          "list, or as text, optionally inside <answer>...</answer>), or set rewards.iou.args.preset to "
          "vlm_r1 or visual_rft for those peers' formats",
    "vlm_r1": "the iou reward (preset vlm_r1) reads one box: write '<answer>[x1, y1, x2, y2]</answer>' or "
              "[x1, y1, x2, y2]",
    "visual_rft": "the iou reward (preset visual_rft) reads \"<answer>[{'Position': [x1, y1, x2, y2], "
                  "'Confidence': c}, ...]</answer>\" or a list of [x1, y1, x2, y2] boxes",
}


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


def boxes_problem(value: Any, preset: str | None = None, **args) -> str | None:
    """The check of the ``boxes`` column that data validation runs on each row before any model
    loads: None when the reward reads `value` as ground truth (under `preset`), else what to write."""
    readers = {None: truth_boxes, "vlm_r1": vlm_r1_truth, "visual_rft": visual_rft_truth}
    if preset not in readers:
        return None  # an unknown preset is refused when the reward is called
    try:
        readers[preset](value, 0)
    except ValueError:
        return BOX_FORMS[preset]
    return None


def _check_args(mode: str, iou_threshold: float, coords: str, frame: str | None, match: str, threshold: float,
                preset: str | None) -> None:
    """ValueError naming the first recipe argument out of its range or choices."""
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


def _predicted(completion: Any, truth: list[Box], extent: tuple[float, float] | None,
               scale: tuple[float, float] | None, log_metric) -> list[Box] | float:
    """The completion's boxes in the image's pixels, or its score when it has none to match: 1.0
    for no box where none is expected, 0.0 for no box or one out of `extent` (counted by reason)."""
    raw = raw_boxes(completion_text(completion))
    if not raw:
        if not truth:
            return 1.0  # no box expected, none given
        log_metric("unparsable/no_box")
        return 0.0
    if not in_range(raw, extent):
        log_metric("unparsable/bad_coords")
        return 0.0
    return scale_boxes(raw, scale)


@register_reward("iou", check_columns={"boxes": boxes_problem}, outputs=TEXT)
def iou_reward(prompts, completions, boxes, coords: Coords = "pixels", image_size=None, mode: Mode = "mean_iou",
               iou_threshold: float = 0.5, frame: Frame | None = None, match: Match = "hungarian",
               threshold: float = 0.0, preset: Preset | None = None, original_size=None, input_size=None,
               math_verify_first: bool = False, log_metric=None, **kwargs) -> list[float | None]:
    """Box reward in [0, 1] against the ``boxes`` column (per row a list of ``[x1, y1, x2, y2]`` in
    the ORIGINAL image's pixels, or None: not applicable -> None; bind another column with
    ``rewards.iou.columns: {boxes: solution}``; text such as ``"<answer>[38, 53, 71, 86]</answer>"``
    is read too). Data validation refuses a value it cannot read (`boxes_problem`) before any
    model loads.

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
    _check_args(mode, iou_threshold, coords, frame, match, threshold, preset)
    n = len(completions)
    if len(boxes) != n:
        raise ValueError(f"iou: column 'boxes' has {len(boxes)} values for {n} completions")
    if preset is not None or frame is not None:
        originals = row_sizes(original_size if original_size is not None else image_size, n, "original_size")
        inputs = row_sizes(input_size, n, "input_size")
    if preset is not None:
        return _preset_rewards(preset, frame, completions, boxes, originals, inputs, math_verify_first)
    sizes = row_sizes(image_size, n)
    log_metric = log_metric or (lambda key, value=1.0: None)  # called outside the engine: not counted
    out: list[float | None] = []
    for i, (completion, row) in enumerate(zip(completions, boxes)):
        if row is None:
            out.append(None)
            continue
        truth = truth_boxes(row, i)
        if frame is None:
            size = check_coords(coords, sizes[i])
            extent, scale = coords_extent(coords, size), coords_scale(coords, size)
        else:
            extent, scale = frame_extent(frame, originals[i], inputs[i]), frame_scale(frame, originals[i], inputs[i], i)
        pred = _predicted(completion, truth, extent, scale, log_metric)
        out.append(pred if isinstance(pred, float) else score_boxes(pred, truth, mode, iou_threshold, match, threshold))
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
            out.append(vlm_r1_score(text, vlm_r1_truth(row, i), frame_scale(frame, originals[i], inputs[i], i)))
        else:
            if frame != "image":
                raise ValueError(f"iou: preset='visual_rft' reads boxes in the image's frame; frame={frame!r}")
            truth = visual_rft_truth(row, i)
            out.append(1.0 if math_verify_first and math_verify_equal(text, row)
                       else visual_rft_score(text, truth))
    return out

