"""Human-preference scores of a text-to-image model on their authors' prompt sets
(docs/bench.md#hpsv2-pickscore-imagereward-hps_bench-pickapic-imagereward_bench):

  hps_bench          HPSv2's benchmark (Wu et al. 2023): 3,200 prompts of four styles (anime,
                     concept-art, paintings, photo; 800 each), one image per prompt, the HPS
                     score 100 x cos(E_img, E_txt) with the HPS checkpoint (v2.0 or v2.1) on
                     open_clip's ViT-H-14 (the ``hpsv2`` reward); the figure per style and the
                     headline the mean over every image (HPSv2's ``evaluate_benchmark`` "Average")
  pickapic           PickScore (Kirstain et al. 2023) on Pick-a-Pic v1's ``test_unique`` captions,
                     one image each: exp(logit_scale) x cos(E_img, E_txt) with PickScore_v1 (the
                     ``pickscore`` reward, times its 1/26 undone)
  imagereward_bench  ImageReward's benchmark (Xu et al. 2023): its 100 prompts (the authors'
                     benchmark-prompts.json, Apache-2.0, kept in the repository), 10 images each,
                     the mean over prompts of each prompt's mean ImageReward, scored by the
                     authors' ``image-reward`` package (``ImageReward.load(...).score``) where it
                     is installed (it pins timm 0.6.13, so it is not an mmrl dependency)

Each benchmark's model files are its options (``--option``); the scorers are registered rewards
that call the existing ones with them.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from mmrl.core.benchmark import Benchmark, Figure
from mmrl.core.scoring import register_reward
from mmrl.rewards.outputs import IMAGE
from mmrl.registry import BENCHMARKS
from mmrl.rewards.clip import _device, hpsv2, pickscore

IMAGEREWARD_PROMPTS = Path(__file__).parent / "prompts" / "imagereward" / "benchmark-prompts.json"
HPS_STYLES = ("anime", "concept-art", "paintings", "photo")
PICKSCORE_SCALE = 26.0  # the pickscore reward divides by it (a reward's scale); the benchmark reports the raw score


def _one(values: Sequence[Any], name: str) -> Any:
    if not values or values[0] in (None, ""):
        raise ValueError(f"this benchmark needs --option {name}=PATH")
    return values[0]


@register_reward("hps_bench_score", outputs=IMAGE)
def hps_bench_score(prompts, completions, hps_checkpoint, hps_model, hps_model_config, device) -> list[float]:
    """100 x the ``hpsv2`` reward (HPSv2's benchmark scale) with the options' checkpoint and model."""
    scores = hpsv2(prompts, completions, pretrained=_one(hps_checkpoint, "hps_checkpoint"), model=hps_model[0],
                   model_config=hps_model_config[0], device=device[0])
    return [100.0 * s for s in scores]


@register_reward("pickscore_bench_score", outputs=IMAGE)
def pickscore_bench_score(prompts, completions, pickscore_path, pickscore_processor, device) -> list[float]:
    """PickScore, exp(logit_scale) x cos: the ``pickscore`` reward times 26."""
    scores = pickscore(prompts, completions, path=_one(pickscore_path, "pickscore_path"),
                       processor=pickscore_processor[0] or None, device=device[0])
    return [PICKSCORE_SCALE * s for s in scores]


@functools.lru_cache(maxsize=1)
def _imagereward_model(name: str, device: str):
    try:
        import ImageReward
    except ImportError:
        raise ImportError("imagereward_bench scores with the authors' package: pip install image-reward "
                          "(it pins timm==0.6.13: install it in its own environment and serve the scorer with "
                          "mmrl serve-reward imagereward_bench_score)") from None
    return ImageReward.load(name, device=device)


@register_reward("imagereward_bench_score", outputs=IMAGE)
def imagereward_bench_score(prompts, completions, imagereward_model, device) -> list[float]:
    """ImageReward's score of each image for its prompt (the package's ``score(prompt, image)``)."""
    model = _imagereward_model(imagereward_model[0], _device(device[0]))
    return [float(model.score(p["prompt"] if isinstance(p, dict) else str(p), image.convert("RGB")))
            for p, image in zip(prompts, completions)]


def hps_rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    """Rows {prompt, style}: the hub's benchmark/{style}.json lists, one row per prompt (docs/bench.md)."""
    rows, counts = [], {}
    for n, row in enumerate(source):
        if row.get("style") not in HPS_STYLES or not isinstance(row.get("prompt"), str):
            raise ValueError(f"row {n}: style {row.get('style')!r} / prompt {str(row.get('prompt'))[:40]!r}: a prompt "
                             f"and one of {', '.join(HPS_STYLES)}")
        index = counts[row["style"]] = counts.get(row["style"], -1) + 1
        rows.append({"id": f"{row['style']}-{index:05d}", "text": row["prompt"], "style": row["style"]})
    return rows


def _caption_rows(key: str | None, column: str):
    """Rows {id, text} from the source's `column` (ids from `key`, else the row's position)."""
    def read(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
        rows = []
        for n, row in enumerate(source):
            if not isinstance(row.get(column), str) or not row[column].strip():
                raise ValueError(f"row {n}: {column} {row.get(column)!r} is not a prompt")
            rows.append({"id": str(row[key]) if key else f"{n:04d}", "text": row[column]})
        return rows
    return read


def _prompt(row: dict, options: Mapping[str, Any]) -> str:
    return row["text"]


BENCHMARKS.register("hps_bench")(Benchmark(
    name="hps_bench", description="HPSv2 benchmark (3,200 prompts: anime, concept-art, paintings, photo): HPS score",
    source="zhwang/HPDv2", split="test", read_rows=hps_rows, prompt=_prompt, scorer="hps_bench_score",
    metrics={"hps": {}}, figures={"hps": Figure("hps")}, headline="hps", default_task="diffusion", categories=("style",),
    official="HPSv2's prompts and the HPS score (100 x cosine of the HPS checkpoint on open_clip ViT-H-14) as its "
             "evaluate_benchmark; scored by mmrl's hpsv2 reward (the hpsv2 package pins protobuf 3.20 and pytest 7.2)",
    greedy=False, samples=1, options={"hps_checkpoint": None, "hps_model": "ViT-H-14", "hps_model_config": None, "device": None}))
BENCHMARKS.register("pickapic")(Benchmark(
    name="pickapic", description="Pick-a-Pic v1 test_unique captions: PickScore of one image each",
    source="yuvalkirstain/pickapic_v1_no_images", split="test_unique", read_rows=_caption_rows(None, "caption"),
    prompt=_prompt, scorer="pickscore_bench_score", metrics={"pickscore": {}}, figures={"pickscore": Figure("pickscore")},
    headline="pickscore", default_task="diffusion",
    official="PickScore_v1 (transformers CLIPModel) as its authors compute it, by mmrl's pickscore reward; the "
             "prompts are Pick-a-Pic v1's test_unique captions",
    greedy=False, samples=1, options={"pickscore_path": None, "pickscore_processor": None, "device": None}))
BENCHMARKS.register("imagereward_bench")(Benchmark(
    name="imagereward_bench", description="ImageReward benchmark (100 DiffusionDB prompts, 10 images each): ImageReward",
    source=str(IMAGEREWARD_PROMPTS), split="test", read_rows=_caption_rows("id", "prompt"), prompt=_prompt,
    scorer="imagereward_bench_score", metrics={"imagereward": {}}, figures={"imagereward": Figure("imagereward")},
    headline="imagereward", default_task="diffusion",
    official="ImageReward's prompts (the authors' file) and its package's score (test-benchmark.py's mean over prompts "
             "of each prompt's mean); the package runs where it is installed or behind mmrl serve-reward",
    greedy=False, samples=10, options={"imagereward_model": "ImageReward-v1.0", "device": None}))


def hps_prompt_rows(folder: str | Path) -> list[dict]:
    """The hub's benchmark folder (benchmark/{style}.json, each a list of prompts) as hps_bench's rows."""
    return [{"prompt": p, "style": s} for s in HPS_STYLES for p in json.loads((Path(folder) / f"{s}.json").read_text())]
