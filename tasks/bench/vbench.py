"""VBench (Huang et al. 2024, Vchitect/VBench): text-to-video generation on 16 dimensions, each on
its own prompts of the standard suite, and VBench's final score (docs/bench.md#vbench-vbench).

The suite (946 prompts, each with the dimensions it serves: ``VBench_full_info.json``, the
authors' file, Apache-2.0) is kept in the repository; every prompt is drawn 5 times (VBench's
videos per prompt) and each video scored on its prompt's dimensions (vbench_dimensions.py).

Final score as VBench's ``scripts/cal_final_score.py``: each dimension's mean normalised
(x - min) / (max - min) with VBench's per-dimension min and max (`NORMALISATION`), the quality
score the mean of the 7 quality dimensions weighted by `WEIGHTS` (dynamic degree 0.5, the rest 1),
the semantic score the same over the 9 semantic ones, the total (4 quality + 1 semantic) / 5.

mmrl computes subject and background consistency, temporal flickering, aesthetic quality,
imaging quality (MUSIQ through pyiqa, the ``imaging`` extra) and dynamic degree; the others need
models not available here (motion smoothness: AMT-S frame interpolation; object class, multiple
objects, colour, spatial relationship: GRiT; human action: UMT; scene: Tag2Text; appearance and
temporal style, overall consistency: ViCLIP / CLIP style scores) and are reported as not computed
(None, so their figures, the semantic, quality and total scores are NaN); `partial_quality_score`
is the weighted mean over the quality dimensions computed, and is not VBench's quality score.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from mmrl.core.benchmark import Benchmark, Figure
from mmrl.core.scoring import register_reward
from mmrl.rewards.outputs import VIDEO
from mmrl.registry import BENCHMARKS
from mmrl.rewards.clip import _device, load_clip, load_head

from .vbench_dimensions import (
    aesthetic_quality,
    background_consistency,
    dynamic_degree,
    imaging_quality,
    subject_consistency,
    temporal_flickering,
)

SUITE = Path(__file__).parent / "prompts" / "vbench" / "VBench_full_info.json"
QUALITY = ("subject_consistency", "background_consistency", "temporal_flickering", "motion_smoothness",
           "aesthetic_quality", "imaging_quality", "dynamic_degree")
SEMANTIC = ("object_class", "multiple_objects", "human_action", "color", "spatial_relationship", "scene",
            "appearance_style", "temporal_style", "overall_consistency")
COMPUTED = ("subject_consistency", "background_consistency", "temporal_flickering", "aesthetic_quality",
            "imaging_quality", "dynamic_degree")
MUSIQ_SPAQ = "https://huggingface.co/chaofengc/IQA-PyTorch-Weights/resolve/main/musiq_spaq_ckpt-358bb6af.pth"  # pyiqa's copy
NORMALISATION = {"subject_consistency": (0.1462, 1.0), "background_consistency": (0.2615, 1.0),
                 "temporal_flickering": (0.6293, 1.0), "motion_smoothness": (0.706, 0.9975),
                 "dynamic_degree": (0.0, 1.0), "aesthetic_quality": (0.0, 1.0), "imaging_quality": (0.0, 1.0),
                 "object_class": (0.0, 1.0), "multiple_objects": (0.0, 1.0), "human_action": (0.0, 1.0),
                 "color": (0.0, 1.0), "spatial_relationship": (0.0, 1.0), "scene": (0.0, 0.8222),
                 "appearance_style": (0.0009, 0.2855), "temporal_style": (0.0, 0.364),
                 "overall_consistency": (0.0, 0.364)}  # VBench's scripts/constant.py NORMALIZE_DIC
WEIGHTS = {**{d: 1.0 for d in QUALITY + SEMANTIC}, "dynamic_degree": 0.5}
QUALITY_WEIGHT, SEMANTIC_WEIGHT = 4.0, 1.0
OPTIONS = {"compute": ",".join(COMPUTED), "dino_path": "facebook/dino-vitb16", "clip_model": "ViT-B-32",
           "clip_pretrained": "openai", "clip_model_config": None, "aesthetic_model": "ViT-L-14",
           "aesthetic_pretrained": "openai", "aesthetic_model_config": None, "aesthetic_head": None,
           "musiq_path": MUSIQ_SPAQ, "musiq_arch": None, "raft_path": None, "device": None}


def vbench_rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    """The suite's rows (ids their position in the file), each with the dimensions it serves."""
    rows = []
    for n, row in enumerate(source):
        unknown = [d for d in row.get("dimension") or [] if d not in NORMALISATION]
        if unknown or not row.get("dimension"):
            raise ValueError(f"row {n}: dimension {row.get('dimension')!r} names none or unknown ones ({unknown})")
        if not isinstance(row.get("prompt_en"), str) or not row["prompt_en"]:
            raise ValueError(f"row {n}: prompt_en {row.get('prompt_en')!r} is not a prompt")
        rows.append({"id": f"{n:04d}", "text": row["prompt_en"], "dimensions": list(row["dimension"])})
    return rows


def _needed(value: Any, option: str, dimension: str) -> Any:
    if not value:
        raise ValueError(f"vbench: {dimension} needs --option {option}=PATH (or leave it out of --option compute=...)")
    return value


def _scorer(dimension: str, settings: Mapping[str, Any]):
    """A function of (video, fps) giving the dimension's score (vbench_dimensions.py)."""
    dev = _device(settings["device"])
    if dimension == "temporal_flickering":
        return lambda video, fps: temporal_flickering(video)
    if dimension == "subject_consistency":
        path = _needed(settings["dino_path"], "dino_path", dimension)
        return lambda video, fps: subject_consistency(video, path, dev)
    if dimension == "dynamic_degree":
        path = _needed(settings["raft_path"], "raft_path", dimension)
        return lambda video, fps: dynamic_degree(video, fps, path, dev)
    if dimension == "imaging_quality":
        path = _needed(settings["musiq_path"], "musiq_path", dimension)
        return lambda video, fps: imaging_quality(video, path, settings["musiq_arch"], dev)
    prefix = "aesthetic_" if dimension == "aesthetic_quality" else "clip_"
    net, _, _ = load_clip(settings[prefix + "model"], settings[prefix + "pretrained"], settings[prefix + "model_config"], dev)
    if dimension == "background_consistency":
        return lambda video, fps: background_consistency(video, net, dev)
    head = load_head(_needed(settings["aesthetic_head"], "aesthetic_head", dimension), dev)
    return lambda video, fps: aesthetic_quality(video, net, head, dev)


@register_reward("vbench", outputs=VIDEO)
def vbench(prompts, completions, dimensions, dimension: str, **columns) -> list[float | None]:
    """VBench's score of `dimension` for each video whose prompt serves it (None for the others, and
    for every video when the dimension is not among the option ``compute`` or not computed by
    mmrl). The models are the benchmark's options, per-sample columns (the same for every sample)."""
    settings = {k: columns[k][0] for k in OPTIONS}
    chosen = [d.strip() for d in str(settings["compute"]).split(",") if d.strip()]
    unknown = [d for d in chosen if d not in COMPUTED]
    if unknown:
        raise ValueError(f"vbench: option compute names {unknown}; mmrl computes {', '.join(COMPUTED)}")
    wanted = [dimension in served for served in dimensions]
    if dimension not in chosen or not any(wanted):
        return [None] * len(completions)
    score = _scorer(dimension, settings)
    fps = columns.get("fps") or [None] * len(completions)
    return [score(video, rate) if want else None for video, want, rate in zip(completions, wanted, fps)]


def _figures() -> dict[str, Figure]:
    """Each dimension's mean and normalised mean, the quality, semantic and total scores (module docstring)."""
    figures: dict[str, Figure] = {d: Figure(d) for d in NORMALISATION}
    for d, (lo, hi) in NORMALISATION.items():
        figures[f"{d}_normalized"] = Figure(d, scale=1 / (hi - lo), shift=-lo / (hi - lo))
    quality = tuple((f"{d}_normalized", WEIGHTS[d]) for d in QUALITY)
    semantic = tuple((f"{d}_normalized", WEIGHTS[d]) for d in SEMANTIC)
    q_total, s_total = sum(w for _, w in quality), sum(w for _, w in semantic)
    share = QUALITY_WEIGHT / (QUALITY_WEIGHT + SEMANTIC_WEIGHT)
    total = tuple((f, w * share / q_total) for f, w in quality) + tuple((f, w * (1 - share) / s_total) for f, w in semantic)
    return {**figures, "quality_score": Figure(combine=quality), "semantic_score": Figure(combine=semantic),
            "total_score": Figure(combine=total),
            "partial_quality_score": Figure(combine=tuple((f, w) for f, w in quality if f[:-len("_normalized")] in COMPUTED))}


BENCHMARKS.register("vbench")(Benchmark(
    name="vbench", description="VBench standard suite (946 prompts, 16 dimensions, 5 videos each): text-to-video "
    "quality and semantics; total = (4 quality + 1 semantic) / 5 of min-max normalised dimensions",
    source=str(SUITE), split="test", read_rows=vbench_rows, prompt=lambda row, options: row["text"], scorer="vbench",
    metrics={d: {"dimension": d} for d in NORMALISATION}, figures=_figures(), headline="total_score",
    default_task="diffusion",
    official="VBench's prompt suite (the authors' file), its normalisation, weights and final score (checked against "
             "cal_final_score.py); the computed dimensions re-implemented and checked against vbench's code; DINO from "
             "transformers, CLIP from open_clip, MUSIQ from pyiqa (as VBench), RAFT from torchvision (not VBench's "
             "RAFT checkpoint); motion smoothness and the 9 semantic dimensions are not computed (NaN), so are the "
             "quality, semantic and total scores; partial_quality_score is mmrl's, over the dimensions computed",
    greedy=False, samples=5, options=OPTIONS))

