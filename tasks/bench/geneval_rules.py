"""GenEval's decision rules (Ghosh et al. 2023, djghosh13/geneval ``evaluation/evaluate_images.py``),
written from the paper's protocol and checked against that file on identical detections
(docs/bench.md#what-is-official-and-what-is-not).

A detection is ``(box, mask)``: box [x1, y1, x2, y2, score] in pixels, mask [H, W] bool or None.
Raw detections (class name -> detections, any order) become the objects an image is judged on by
`kept_objects`: per class, those scoring above the threshold (0.3; 0.9 for the counting task),
highest first (ties: the later detection first, as GenEval orders them), at most 16, and with
an overlap limit below 1 a greedy suppression of boxes whose IoU with a kept one reaches it
(GenEval's default 1.0 suppresses none).

An image is correct (`judge`) when every ``include`` clause holds and no ``exclude`` clause does:
``include {class, count}``: at least `count` objects of the class (the `count` most confident are
the ones judged further); with ``color`` at least `count` of them classified that colour; with
``position [relation, i]`` each of them stands in `relation` (``left of``, ``right of``, ``above``,
``below``) to each object judged for include clause i, which must itself have held.
``exclude {class, count}``: fails when `count` or more objects of the class are found.
The relation of A to B (`relations`): the centres' offset with each axis shrunk towards 0 by
0.1 x (A's + B's size on that axis), divided by the offset's length; above 0.5 on an axis (x
right, y down) names the relation; none when the shrunk offset is within 1e-3 of zero.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
THRESHOLD, COUNTING_THRESHOLD, MAX_OBJECTS, MAX_OVERLAP, POSITION_MARGIN = 0.3, 0.9, 16, 1.0, 0.1
Detection = tuple[np.ndarray, Any]  # (box [5]: x1, y1, x2, y2, score; mask [H, W] bool or None)
ColourFn = Callable[[Sequence[Detection], str], list[str]]  # (objects of one class, class) -> their colours


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two pixel boxes counted inclusively (a box [0, 0, 9, 9] is 10 x 10 pixels), as GenEval's."""
    def area(x1, y1, x2, y2):
        return max(x2 - x1 + 1, 0) * max(y2 - y1 + 1, 0)
    inter = area(max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))
    union = area(*a[:4]) + area(*b[:4]) - inter
    return inter / union if union else 0.0


def kept_objects(raw: Mapping[str, Sequence[Detection]], tag: str, threshold: float = THRESHOLD,
                 counting_threshold: float = COUNTING_THRESHOLD, max_objects: int = MAX_OBJECTS,
                 max_overlap: float = MAX_OVERLAP) -> dict[str, list[Detection]]:
    """The objects an image is judged on (module docstring), most confident first; classes with none left out."""
    floor = counting_threshold if tag == "counting" else threshold
    out: dict[str, list[Detection]] = {}
    for name, detections in raw.items():
        scores = np.array([float(d[0][4]) for d in detections])
        order = np.argsort(scores)[::-1]  # ties: the later detection first, as GenEval's argsort()[::-1]
        ranked = [detections[i] for i in order if scores[i] > floor][:max_objects]
        kept: list[Detection] = []
        while ranked:
            best = ranked.pop(0)
            kept.append(best)
            if max_overlap < 1:
                ranked = [d for d in ranked if box_iou(best[0], d[0]) < max_overlap]
        if kept:
            out[name] = kept
    return out


def relations(a: Sequence[float], b: Sequence[float], margin: float = POSITION_MARGIN) -> set[str]:
    """Where box `a` is relative to box `b` (module docstring)."""
    a, b = np.asarray(a[:4], dtype=np.float64), np.asarray(b[:4], dtype=np.float64)
    centre_a, centre_b = (a[:2] + a[2:]) / 2, (b[:2] + b[2:]) / 2
    size_a, size_b = np.abs(a[2:] - a[:2]), np.abs(b[2:] - b[:2])
    offset = centre_a - centre_b
    shrunk = np.maximum(np.abs(offset) - margin * (size_a + size_b), 0) * np.sign(offset)
    if np.all(np.abs(shrunk) < 1e-3):
        return set()
    dx, dy = shrunk / np.linalg.norm(offset)
    named = {"left of": dx < -0.5, "right of": dx > 0.5, "above": dy < -0.5, "below": dy > 0.5}
    return {name for name, holds in named.items() if holds}


def _include_holds(clause: Mapping[str, Any], found: list[Detection], colours: ColourFn,
                   judged: list[list[Detection] | None], margin: float) -> bool:
    if len(found) < clause["count"]:
        return False
    if "color" in clause and colours(found, clause["class"]).count(clause["color"]) < clause["count"]:
        return False
    if "position" in clause:
        relation, target = clause["position"]
        if judged[target] is None:
            return False
        return all(relation in relations(obj[0], other[0], margin) for obj in found for other in judged[target])
    return True


def judge(objects: Mapping[str, list[Detection]], metadata: Mapping[str, Any], colours: ColourFn,
          margin: float = POSITION_MARGIN) -> bool:
    """Whether an image with `objects` (`kept_objects`) meets its prompt's `metadata` (module docstring)."""
    correct, judged = True, []
    for clause in metadata.get("include", []):
        found = list(objects.get(clause["class"], []))[:clause["count"]]
        holds = _include_holds(clause, found, colours, judged, margin)
        correct = correct and holds
        judged.append(found if holds else None)
    for clause in metadata.get("exclude", []):
        if len(objects.get(clause["class"], [])) >= clause["count"]:
            correct = False
    return correct
