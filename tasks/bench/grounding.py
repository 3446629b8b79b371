"""RefCOCO, RefCOCO+ and RefCOCOg referring-expression grounding: Acc@0.5, the share of expressions
whose predicted box overlaps the annotated one with IoU >= 0.5 (docs/bench.md#refcoco).

Rows are lmms-eval's ``refcoco*_bbox_rec`` rows: one per referring expression (``answer`` holds
several), the box COCO's [x, y, width, height] in the image's pixels, made [x1, y1, x2, y2]. The
model's first box (`rewards.box_parsing`: plain lists, Qwen2.5-VL ``bbox_2d`` JSON, Qwen-VL
``<box>``, ``<|box_start|>``) is brought to the image's pixels from the model family's frame (option
``frame``): "input" (pixels of the image as the processor resized it: Qwen2.5-VL), "normalized_1000"
(0-1000: Qwen2-VL, Qwen3-VL), "image" (the original pixels), "normalized_1" (0-1: lmms-eval's
prompt); "auto" picks it from the loaded model's type. No box, or a degenerate one, scores 0
(lmms-eval scores its [0, 0, 0, 0]).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mmrl.core.benchmark import Benchmark, Figure
from mmrl.core.scoring import register_reward
from mmrl.rewards.outputs import TEXT
from mmrl.registry import BENCHMARKS
from mmrl.rewards.box_frames import coords_scale, frame_scale, scale_boxes
from mmrl.rewards.box_parsing import raw_boxes
from mmrl.rewards.iou import box_iou
from mmrl.rewards.text import completion_text

FRAME_OF_MODEL = {"qwen2_5_vl": "input", "qwen2_vl": "normalized_1000", "qwen3_vl": "normalized_1000"}
PROMPTS = {
    "input": "Locate {expression} in the image and output its bbox coordinates in JSON format.",
    "normalized_1000": "Locate {expression} in the image and output its bbox coordinates in JSON format.",
    "image": "Locate {expression} in the image and output its bbox coordinates in JSON format.",
    "normalized_1": ("Bounding box coordinates are specified in the format (top-left x, top-left y, bottom-right x, "
                     "bottom-right y). All values are floating point numbers bounded between 0 and 1. Please provide "
                     "the bounding box coordinate of the region this sentence describes: {expression}"),
}


def predicted_box(text: str, frame: str, original: Any, input_size: Any) -> list[float] | None:
    """The first box of the response in the image's pixels (None: no box)."""
    boxes = raw_boxes(text)
    if not boxes:
        return None
    scale = coords_scale("norm1", original) if frame == "normalized_1" else frame_scale(frame, original, input_size, 0)
    return scale_boxes(boxes[:1], scale)[0]


@register_reward("refcoco_box", outputs=TEXT)
def refcoco_box(prompts, completions, boxes, original_size, input_size, frame, metric: str = "acc",
                threshold: float = 0.5) -> list[float]:
    """Per expression, with ``metric`` "acc" 1.0 when the IoU of the first predicted box with ``boxes``'
    first is >= `threshold`, with "iou" the IoU (0 without a box); ``frame`` per sample (the option)."""
    out = []
    for c, truth, original, size, f in zip(completions, boxes, original_size, input_size, frame):
        box = predicted_box(completion_text(c), f, original, size)
        iou = box_iou(box, truth[0]) if box is not None else 0.0
        out.append(iou if metric == "iou" else float(iou >= threshold))
    return out


def _rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    rows = []
    for n, row in enumerate(source):
        x, y, w, h = (float(v) for v in row["bbox"])
        expressions = row["answer"] if isinstance(row["answer"], (list, tuple)) else [row["answer"]]
        key = row.get("question_id", n)
        rows += [{"id": f"{key}-{j}", "expression": str(e), "image": row["image"], "boxes": [[x, y, x + w, y + h]]}
                 for j, e in enumerate(expressions)]
    return rows


def _frame(options: Mapping[str, Any], policy: Any) -> dict[str, Any]:
    if options["frame"] != "auto":
        return dict(options)
    kind = getattr(getattr(getattr(policy, "model", None), "config", None), "model_type", None)
    return {**options, "frame": FRAME_OF_MODEL.get(kind, "image")}


def _refcoco(name: str, source: str, split: str, description: str) -> Benchmark:
    return Benchmark(
        name=name, description=description, source=source, split=split, read_rows=_rows,
        prompt=lambda row, options: PROMPTS[options["frame"]].format(expression=row["expression"]),
        scorer="refcoco_box", metrics={"acc@0.5": {"metric": "acc", "threshold": 0.5}, "iou": {"metric": "iou"}},
        figures={"acc@0.5": Figure("acc@0.5", scale=100.0), "mean_iou": Figure("iou")}, headline="acc@0.5",
        default_task="vlm", official="IoU and the box frames are mmrl's iou reward's (box_iou tested against lmms-eval "
        "0.7.3's compute_iou); lmms-eval's own 0-1 prompt is frame normalized_1",
        policy={"vlm": {"max_new_tokens": 128, "image_column": "image"}}, options={"frame": "auto"},
        resolve_options=_frame)


for _name, _source, _split, _what in (
        ("refcoco", "lmms-lab/RefCOCO", "val", "RefCOCO val (also testA, testB: --split)"),
        ("refcoco+", "lmms-lab/RefCOCOplus", "val", "RefCOCO+ val (also testA, testB: --split)"),
        ("refcocog", "lmms-lab/RefCOCOg", "val", "RefCOCOg val (also test: --split)")):
    BENCHMARKS.register(_name)(_refcoco(_name, _source, _split, f"{_what}: referring-expression grounding, Acc@0.5"))
