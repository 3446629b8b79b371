"""The embedded demos' held-out evaluators: a second judge beside each demo's training reward,
never used as a reward (`mmrl.train.loop.evaluation.Evaluator`, registered in `DEMO_EVALUATORS` by
`tasks/__init__.py`). Each scores one sample in [0, 1]:

- `exact_match`: the last ``<tag>...</tag>`` block equals the `answer` column (whitespace
  collapsed), 1 or 0; no partial credit and no format bonus (text, dlm);
- `tex_match`: the completion's LaTeX compiles and its TeX rendering is pixel-identical to the
  reference's (latex; where TeX is not installed, matplotlib's mathtext renders both and the
  name says so);
- `boxes_at_iou`: the fraction of boxes found, the k-th predicted box against the k-th ground-truth
  box, with IoU >= `threshold`, over max(#predicted, #ground truth) (extra boxes count as misses;
  grounding);
- `exact_transcript`: the whole transcript equals the `reference` column, case and whitespace
  aside, 1 or 0 (sentence accuracy; asr, whose reward is 1 - WER with partial credit per word);
- `zoom_answers`: the answer colour right, 1 or 0, with the zoom-use and right-place counts (zoom);
- the t2i demo's judge is a colour-and-shape classifier (`shape_judge.py`), the t2v demo's a clip judge (`clip_judge.py`).
"""

from __future__ import annotations

import re

import numpy as np
from mmrl.rewards.box_parsing import parse_boxes
from mmrl.rewards.iou import box_iou
from mmrl.rewards.latex_render import extract_latex
from mmrl.rewards.latex_sandbox import compile_latex, tex_available
from mmrl.rewards.text import completion_text, extract_answer

from mmrl.train.loop.evaluation import Evaluator


def _same(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def exact_match(tag: str = "answer") -> Evaluator:
    def score(prompts, completions, answer, **columns):
        return [None if truth is None else
                float((found := extract_answer(completion_text(c), tag)) is not None and _same(found, truth))
                for c, truth in zip(completions, answer)]
    return Evaluator(f"exact-match accuracy of the <{tag}> answer", score)


def exact_transcript() -> Evaluator:
    def score(prompts, completions, reference, **columns):
        return [None if truth is None else float(_same(completion_text(c).lower(), truth.lower()))
                for c, truth in zip(completions, reference)]
    return Evaluator("sentence accuracy (the whole transcript right)", score)


def tex_match(timeout: float = 10.0) -> Evaluator:
    renderer = "latex" if tex_available() else "mathtext"
    references: dict[str, np.ndarray | None] = {}

    def render(code: str) -> np.ndarray | None:
        if re.search(r"\\(write|input|include|openout|read|catcode|special)", code):
            return None
        return compile_latex(code, "formula", timeout=timeout, renderer=renderer).image

    def score(prompts, completions, reference, **columns):
        codes = [extract_latex(completion_text(c)) for c in completions]
        renders = {code: render(code) for code in dict.fromkeys(codes)}
        out: list[float | None] = []
        for code, ref in zip(codes, reference):
            if ref is None:
                out.append(None)
                continue
            if ref not in references:
                references[ref] = render(ref)
            target, mine = references[ref], renders[code]
            if target is None:
                raise ValueError(f"tex_match: the reference {ref!r} does not render with {renderer}")
            out.append(float(mine is not None and mine.shape == target.shape and np.array_equal(mine, target)))
        return out
    name = ("TeX-rendered match (pixel-identical latex+dvipng renders)" if renderer == "latex" else
            "mathtext-rendered match (TeX is not installed: matplotlib mathtext renders instead)")
    return Evaluator(name, score)


def boxes_at_iou(threshold: float = 0.5, coords: str = "pixels") -> Evaluator:
    def score(prompts, completions, boxes, image_size=None, **columns):
        out: list[float | None] = []
        for i, (c, truth) in enumerate(zip(completions, boxes)):
            if not truth:
                out.append(None)
                continue
            size = image_size[i] if image_size is not None else None
            found = parse_boxes(completion_text(c), coords, size)
            hits = sum(box_iou(p, t) >= threshold for p, t in zip(found, truth))
            out.append(hits / max(len(found), len(truth)))
        return out
    return Evaluator(f"fraction of boxes with IoU >= {threshold}", score)


def zoom_answers() -> Evaluator:
    """The zoom demo's: the <answer> is the dot's colour (1 or 0); it counts, as ``episodes``,
    ``zoomed`` (episodes with a zoom that ran) and ``zoomed_on_dot`` (those whose first zoom's box
    holds the whole dot), the zoom-use rate and the share of right places beside it."""
    from .synthetic.zoom_patches import contains, zoom_boxes

    def score(prompts, completions, answer, dot_box, scale, tool_calls, log_metric, **columns):
        out = []
        for c, truth, dot, k, calls in zip(completions, answer, dot_box, scale, tool_calls):
            boxes = zoom_boxes(calls, k)
            log_metric("episodes")
            log_metric("zoomed", float(bool(boxes)))
            log_metric("zoomed_on_dot", float(bool(boxes) and contains(boxes[0], dot)))
            out.append(float((found := extract_answer(completion_text(c), "answer")) is not None and _same(found, truth)))
        return out
    return Evaluator("accuracy of the <answer> colour (zoom use and zooms on the dot counted)", score)
