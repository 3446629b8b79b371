"""GenEval (Ghosh et al. 2023, djghosh13/geneval): compositional text-to-image generation judged by
an object detector and a colour classifier (docs/bench.md#geneval-geneval).

Its 553 prompts, with their metadata (``tag``: the task; ``include`` / ``exclude`` clauses of
``class``, ``count``, ``color``, ``position``), are kept in the repository
(tasks/bench/prompts/geneval/evaluation_metadata.jsonl, MIT, the authors' file unchanged). Each
prompt is drawn 4 times (GenEval's ``n_samples``); an image is correct or not by GenEval's rules
(geneval_rules.py) on the objects a detector finds (geneval_detectors.py). The six tasks'
figures (single_object, two_object, counting, colors, position, color_attr) are the share of
correct images per task; the headline ``overall`` is their unweighted mean (GenEval's
``summary_scores.py``), not the share over all images.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Mapping, Sequence

from mmrl.core.benchmark import Benchmark, Figure
from mmrl.core.scoring import register_reward
from mmrl.rewards.outputs import IMAGE
from mmrl.registry import BENCHMARKS

from .geneval_detectors import ColourClassifier, class_names
from .geneval_detectors import detector as make_detector
from .geneval_rules import COLORS, judge, kept_objects

METADATA = Path(__file__).parent / "prompts" / "geneval" / "evaluation_metadata.jsonl"
TASKS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
RELATIONS = ("left of", "right of", "above", "below")
OPTIONS = {"detector": "transformers", "detector_path": "facebook/detr-resnet-50", "detector_config": None,
           "clip_model": "ViT-L-14", "clip_pretrained": "openai", "clip_model_config": None, "threshold": 0.3,
           "counting_threshold": 0.9, "max_objects": 16, "max_overlap": 1.0, "position_margin": 0.1, "device": None}


def _check_clause(n: int, kind: str, clause: Mapping[str, Any], names: set[str], included: int) -> None:
    where = f"row {n}: {kind}"
    if clause.get("class") not in names:
        raise ValueError(f"{where} class {clause.get('class')!r} is not one of GenEval's 80 classes")
    if not isinstance(clause.get("count"), int) or clause["count"] < 1:
        raise ValueError(f"{where} count {clause.get('count')!r} is not a positive integer")
    if "color" in clause and clause["color"] not in COLORS:
        raise ValueError(f"{where} color {clause['color']!r} is not one of {', '.join(COLORS)}")
    if "position" in clause:
        relation, target = clause["position"]
        if relation not in RELATIONS or not 0 <= target < included:
            raise ValueError(f"{where} position {clause['position']!r}: a relation ({', '.join(RELATIONS)}) "
                             "and the index of an earlier include clause")


def geneval_rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    """GenEval's metadata rows (their order is the prompt id, as GenEval's folders 00000...)."""
    names, rows = set(class_names()), []
    for n, row in enumerate(source):
        if row.get("tag") not in TASKS:
            raise ValueError(f"row {n}: tag {row.get('tag')!r} is not one of {', '.join(TASKS)}")
        for i, clause in enumerate(row.get("include") or []):
            _check_clause(n, "include", clause, names, i)
        for clause in row.get("exclude") or []:
            _check_clause(n, "exclude", clause, names, 0)
        rows.append({"id": f"{n:05d}", "text": row["prompt"], "tag": row["tag"], "include": row.get("include") or [],
                     "exclude": row.get("exclude") or []})
    return rows


@functools.lru_cache(maxsize=2)
def colour_classifier(model: str, pretrained: str | None, model_config: str | None, device: str | None) -> ColourClassifier:
    return ColourClassifier(model, pretrained, model_config, device)


def _colours(image: Any, clip: tuple, found: list, name: str) -> list[str]:
    """The colours of the `found` objects of class `name` in the image (the CLIP settings `clip`)."""
    return colour_classifier(*clip)(image, found, name)


@register_reward("geneval", outputs=IMAGE)
def geneval(prompts, completions, id, tag, include, exclude, detector, detector_path, detector_config,
            clip_model, clip_pretrained, clip_model_config, threshold, counting_threshold, max_objects, max_overlap,
            position_margin, device, task: str | None = None) -> list[float | None]:
    """1.0 when an image meets its prompt's metadata by GenEval's rules, else 0.0; with `task`, None
    for the images of other tasks. The detector and colour settings are the benchmark's options
    (per-sample columns, the same for every sample): the module docstrings of geneval_detectors.py."""
    detect = make_detector(detector[0], detector_path[0], detector_config[0], device[0])
    out: list[float | None] = []
    for j, image in enumerate(completions):
        if task is not None and tag[j] != task:
            out.append(None)
            continue
        image = image.convert("RGB")
        objects = kept_objects(detect(image, id[j]), tag[j], float(threshold[j]), float(counting_threshold[j]),
                               int(max_objects[j]), float(max_overlap[j]))
        colours = functools.partial(_colours, image, (clip_model[j], clip_pretrained[j], clip_model_config[j], device[j]))
        metadata = {"include": include[j], "exclude": exclude[j]}
        out.append(float(judge(objects, metadata, colours, float(position_margin[j]))))
    return out


BENCHMARKS.register("geneval")(Benchmark(
    name="geneval", description="GenEval (553 prompts, 6 tasks, 4 images each): object-focused compositional "
    "text-to-image alignment by a detector and a colour classifier", source=str(METADATA), split="test",
    read_rows=geneval_rows, prompt=lambda row, options: row["text"], scorer="geneval",
    metrics={task: {"task": task} for task in TASKS},
    figures={**{task: Figure(task) for task in TASKS}, "overall": Figure(combine=tuple((t, 1.0) for t in TASKS))},
    headline="overall", default_task="diffusion", categories=(),
    official="GenEval's prompts and metadata (the authors' file) and its aggregation; its decision rules re-implemented "
             "and checked against evaluate_images.py on identical detections; the published figures use "
             "detector=mask2former (mmdet Mask2Former Swin-S) and CLIP ViT-L-14 (openai): the summary's "
             "generation.options name the detector that produced these figures",
    greedy=False, samples=4, options=OPTIONS))
