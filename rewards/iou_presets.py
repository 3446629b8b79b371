"""The box rewards of VLM-R1 and Visual-RFT, rule for rule, on their own answer formats (the
``preset`` argument of the ``iou`` reward).

``vlm_r1`` (om-ai-lab/VLM-R1, ``vlm_modules/qwen_module.py``, ``iou_reward``, REC task): the
ground truth is the JSON box in the LAST ``<answer>...</answer>`` of the solution (or a box);
the prediction is the FIRST ``[x1, y1, x2, y2]`` of non-negative integers (``\\[(\\d+),\\s*(\\d+),
\\s*(\\d+),\\s*(\\d+)]``) inside the FIRST ``<answer>...</answer>`` of the completion, rescaled from
the model's input frame (the processor's resized image) to the image's frame:
x * W_image / W_input, y * H_image / H_input. Its IoU counts the overlap only where it is more
than 1 pixel wide and high (intersection corners max(x1), min(x2) - 1; area
(ix2 - ix1 + 1) * (iy2 - iy1 + 1), areas of the boxes without +1). No answer, no box, or an
empty union -> 0.0. The reward is the IoU itself.

``visual_rft`` (Liuziyu77/Visual-RFT, ``src/virft/src/open_r1/grpo.py``, ``accuracy_reward_iou``,
detection): boxes are ``[{'Position': [x1, y1, x2, y2], 'Confidence': c}, ...]`` inside
``<answer>`` (single quotes allowed); the completion's first ``<answer>...</answer>`` on one line
(else the whole text) with ``[[`` -> ``[``, ``]]`` -> ``]`` and newlines removed; a list cut
short is closed after its last complete object. Duplicate positions are dropped; predictions,
by decreasing confidence, each take the unmatched ground-truth box of highest IoU (standard
IoU, no pixel offset), counted only when that IoU is > 0.5 (else 0); reward = sum of counted
IoUs / max(G, P), at most 1. Anything unreadable -> 0.0. Visual-RFT first tries
``math_verify`` equality of the whole completion with the solution and gives 1.0 when it holds;
on box lists math_verify reads the first number of each side, so that shortcut pays 1.0 whenever
those coincide (3% of random near-miss completions in our comparison). It is reproduced only
with ``math_verify_first=True`` (needs ``pip install math-verify``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_VLM_R1_BOX = re.compile(r"\[(\d+),\s*(\d+),\s*(\d+),\s*(\d+)]")
_RFT_ANSWER = re.compile(r"<answer>(.*?)</answer>")  # no DOTALL, as Visual-RFT


def vlm_r1_truth(solution: Any, i: int) -> list[float]:
    """The ground-truth box of a VLM-R1 solution: ``<answer>[x1, y1, x2, y2]</answer>`` (last
    answer block), a bare JSON box string, or a box."""
    box = solution
    if isinstance(solution, str):
        found = _ANSWER.findall(solution)
        try:
            box = json.loads((found[-1] if found else solution).strip())
        except json.JSONDecodeError:
            box = None
    if isinstance(box, list) and len(box) == 1 and isinstance(box[0], list):
        box = box[0]
    if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
        raise ValueError(f"iou (preset vlm_r1): ground truth row {i} is {str(solution)[:120]!r}; expected "
                         f"'<answer>[x1, y1, x2, y2]</answer>' or a box")
    return [float(v) for v in box]


def vlm_r1_iou(box1: Sequence[float], box2: Sequence[float]) -> float:
    """VLM-R1's IoU: overlaps of 1 pixel or less count as none (see the module docstring)."""
    inter_x1, inter_y1 = max(box1[0], box2[0]), max(box1[1], box2[1])
    inter_x2, inter_y2 = min(box1[2] - 1, box2[2] - 1), min(box1[3] - 1, box2[3] - 1)
    inter = (inter_x2 - inter_x1 + 1) * (inter_y2 - inter_y1 + 1) if inter_x1 < inter_x2 and inter_y1 < inter_y2 else 0
    union = (box1[2] - box1[0]) * (box1[3] - box1[1]) + (box2[2] - box2[0]) * (box2[3] - box2[1]) - inter
    return float(inter) / union if union != 0 else 0.0


def vlm_r1_score(text: str, truth: Sequence[float], scale: tuple[float, float] | None) -> float:
    """VLM-R1's reward of one completion; `scale` = (W_image / W_input, H_image / H_input), or None
    when the prediction is already in the image's frame."""
    answer = _ANSWER.search(text)
    if not answer:
        return 0.0
    box = _VLM_R1_BOX.search(answer.group(1).strip())
    if not box:
        return 0.0
    pred = [float(int(v)) for v in box.groups()]
    if scale is not None:
        sx, sy = scale
        pred = [pred[0] * sx, pred[1] * sy, pred[2] * sx, pred[3] * sy]
    return vlm_r1_iou(pred, truth)


def _rft_boxes(text: str) -> list | None:
    """Visual-RFT's ``extract_bbox``: the JSON list after the first ``<answer>``."""
    if "<answer>" not in text:
        return None
    start = text.find("<answer>") + len("<answer>")
    end = text.find("</answer>")
    content = text[start:end if end != -1 else len(text)]
    if not content.endswith("]"):
        content = content.rsplit("},", 1)[0] + "}]"
    try:
        return json.loads(content.replace("'", '"'))
    except json.JSONDecodeError:
        return None


def visual_rft_truth(solution: Any, i: int) -> list[list[float]]:
    """Ground-truth boxes of a Visual-RFT solution (``<answer>[{'Position': ...}, ...]</answer>``), or a
    list of boxes / ``{"Position"}`` dicts."""
    boxes = _rft_boxes(solution.strip()) if isinstance(solution, str) else solution
    try:
        out = [[float(v) for v in (b["Position"] if isinstance(b, dict) else b)] for b in boxes]
    except (TypeError, KeyError, ValueError):
        out = None
    if out is None or any(len(b) != 4 for b in out):
        raise ValueError(f"iou (preset visual_rft): ground truth row {i} is {str(solution)[:120]!r}; expected "
                         f"\"<answer>[{{'Position': [x1, y1, x2, y2], 'Confidence': c}}, ...]</answer>\" or boxes")
    return out


def rft_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Visual-RFT's ``calculate_iou`` (standard IoU; raises ZeroDivisionError on an empty union)."""
    xi1, yi1, xi2, yi2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    if xi2 <= xi1 or yi2 <= yi1:
        return 0.0
    inter = (xi2 - xi1) * (yi2 - yi1)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def math_verify_equal(text: str, solution: Any) -> bool:
    """Visual-RFT's first test: ``verify(parse(completion), parse(solution))`` (math_verify), False
    when it raises."""
    try:
        from math_verify import parse, verify
    except ImportError as e:
        raise ImportError("iou: math_verify_first=True needs the math_verify package (pip install math-verify)") from e
    try:
        return float(verify(parse(text), parse(str(solution)))) > 0
    except Exception:  # as Visual-RFT: a failed verification is not a match
        return False


def visual_rft_score(text: str, truth: list[list[float]], threshold: float = 0.5) -> float:
    """Visual-RFT's IoU reward of one completion (see the module docstring), without the
    math_verify shortcut (`math_verify_equal`)."""
    match = _RFT_ANSWER.search(text)
    student = "<answer>" + (match.group(1).strip() if match else text.strip()) + "</answer>"
    student = student.replace("[[", "[").replace("]]", "]").replace("\n", "")
    try:
        pred = _rft_boxes(student)
        if pred is None or not isinstance(pred[0], dict):
            return 0.0
        unique, seen = [], set()
        for box in pred:
            key = tuple(box["Position"])
            if key not in seen:
                seen.add(key)
                unique.append(box)
        matched: set[int] = set()
        ious = []
        for box in sorted(unique, key=lambda b: b["Confidence"], reverse=True):
            best, best_iou = -1, 0
            for k, gt in enumerate(truth):
                if k not in matched:
                    iou = rft_iou(gt, box["Position"])
                    if iou > best_iou:
                        best, best_iou = k, iou
            if best_iou > threshold:
                ious.append(best_iou)
                matched.add(best)
            else:
                ious.append(0)
        reward = sum(ious) / max(len(truth), len(ious))  # compute_reward_iou_v2
    except (TypeError, KeyError, ValueError, IndexError, ZeroDivisionError, AttributeError):
        return 0.0
    return float(min(reward, 1.0))
