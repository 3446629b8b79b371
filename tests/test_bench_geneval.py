"""GenEval (tasks/bench/geneval*.py): its decision rules on hand-written detections, the colour
classifier's crops and zero-shot weights, a tiny random transformers detector behind the detector
interface, the metadata's checks, and the benchmark end to end on the tiny diffusion model with
recorded detections and a tiny CLIP. The rules were also run beside GenEval's evaluate_images.py
on 20,000 random detections (docs/bench.md)."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.tasks.bench.geneval import METADATA, geneval_rows
from mmrl.tasks.bench.geneval_detectors import ColourClassifier, object_crop, transformers_detections
from mmrl.tasks.bench.geneval_rules import COLORS, judge, kept_objects, relations

TINY_CLIP = {"embed_dim": 16,
             "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
             "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


def det(x1, y1, x2, y2, score=0.9, mask=None):
    return (np.array([x1, y1, x2, y2, score], dtype=float), mask)


def no_colours(found, name):
    raise AssertionError("no colour asked")


def test_relations_shrink_the_offset_by_a_tenth_of_both_sizes():
    assert relations([0, 0, 10, 10], [20, 0, 30, 10]) == {"left of"}
    assert relations([0, 20, 10, 30], [0, 0, 10, 10]) == {"below"}
    # centres 10 apart on x, sizes 10 + 40: shrunk by 5, so dx = 5 / 10 = 0.5, not above 0.5
    assert relations([0, 0, 10, 10], [-15, -15, 25, 25]) == set()
    assert relations([30, 30, 40, 40], [0, 0, 10, 10]) == {"right of", "below"}  # diagonal: both
    assert relations([0, 0, 10, 10], [1, 0, 11, 10]) == set()  # within the margin


def test_kept_objects_threshold_counting_threshold_limit_and_overlap():
    raw = {"cat": [det(0, 0, 5, 5, 0.2), det(0, 0, 5, 5, 0.5), det(10, 10, 20, 20, 0.95)], "dog": [det(0, 0, 1, 1, 0.1)]}
    kept = kept_objects(raw, "single_object")
    assert [d[0][4] for d in kept["cat"]] == [0.95, 0.5] and "dog" not in kept
    assert [d[0][4] for d in kept_objects(raw, "counting")["cat"]] == [0.95]  # 0.9 for counting
    assert len(kept_objects(raw, "single_object", max_objects=1)["cat"]) == 1
    overlapping = {"cat": [det(0, 0, 10, 10, 0.9), det(1, 1, 10, 10, 0.8), det(50, 50, 60, 60, 0.7)]}
    assert len(kept_objects(overlapping, "two_object")["cat"]) == 3  # GenEval's default suppresses none
    assert len(kept_objects(overlapping, "two_object", max_overlap=0.5)["cat"]) == 2


def test_judge_counts_excludes_colours_and_positions():
    three = {"orange": [det(i * 10, 0, i * 10 + 5, 5) for i in range(3)]}
    counting = {"include": [{"class": "orange", "count": 3}], "exclude": [{"class": "orange", "count": 4}]}
    assert judge(three, counting, no_colours)
    assert not judge({"orange": three["orange"] * 2}, counting, no_colours)  # 6 >= 4: excluded
    assert not judge({"orange": three["orange"][:2]}, counting, no_colours)
    coloured = {"include": [{"class": "car", "count": 1, "color": "red"}]}
    assert judge({"car": [det(0, 0, 5, 5)]}, coloured, lambda found, name: ["red"] * len(found))
    assert not judge({"car": [det(0, 0, 5, 5)]}, coloured, lambda found, name: ["blue"] * len(found))
    above = {"include": [{"class": "sink", "count": 1}, {"class": "tie", "count": 1, "position": ["above", 0]}]}
    sink, tie = det(0, 50, 10, 60), det(0, 0, 10, 10)
    assert judge({"sink": [sink], "tie": [tie]}, above, no_colours)
    assert not judge({"sink": [tie], "tie": [sink]}, above, no_colours)
    assert not judge({"tie": [tie]}, above, no_colours)  # no target: the sink clause failed


def test_colour_classifier_crops_the_box_greys_outside_the_mask_and_averages_its_templates(tmp_path):
    image = Image.new("RGB", (8, 8), (255, 0, 0))
    mask = np.zeros((8, 8), dtype=bool)
    mask[2:4, 2:4] = True
    crop = np.asarray(object_crop(image, det(2, 2, 6, 6, 0.9, mask)))
    assert crop.shape == (4, 4, 3) and tuple(crop[0, 0]) == (255, 0, 0) and tuple(crop[3, 3]) == (0x99, 0x99, 0x99)
    config = tmp_path / "mmrl-tiny-clip-geneval.json"
    config.write_text(json.dumps(TINY_CLIP))
    classifier = ColourClassifier("unused", None, str(config), "cpu")
    net, tokenizer = classifier.net, classifier.tokenizer
    with torch.no_grad():  # GenEval's (clip_benchmark's) zero-shot weights, computed here colour by colour
        texts = [[f"a photo of a {c} car", f"a photo of a {c}-colored car", f"a photo of a {c} object"] for c in COLORS]
        weights = torch.stack([torch.nn.functional.normalize(net.encode_text(tokenizer(t)), dim=-1).mean(0) for t in texts])
        weights = weights / weights.norm(dim=-1, keepdim=True)
        pixels = classifier.preprocess(image.crop((0, 0, 8, 8)))[None]
        want = COLORS[(torch.nn.functional.normalize(net.encode_image(pixels), dim=-1) @ weights.T).argmax().item()]
    assert classifier(image, [det(0, 0, 8, 8)], "car") == [want]


def test_a_transformers_detector_gives_every_box_by_genevals_class_names(tmp_path):
    from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessor, ResNetConfig
    torch.manual_seed(0)
    backbone = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], out_features=["stage2"])
    config = DetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False, d_model=16,
                        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                        encoder_ffn_dim=16, decoder_ffn_dim=16, num_queries=5, id2label={0: "mouse"}, label2id={"mouse": 0})
    DetrForObjectDetection(config).save_pretrained(tmp_path)
    DetrImageProcessor(size={"shortest_edge": 32, "longest_edge": 32}).save_pretrained(tmp_path)
    found = transformers_detections(str(tmp_path), "cpu", Image.new("RGB", (40, 30), "red"))
    assert set(found) == {"computer mouse"} and len(found["computer mouse"]) == 5  # COCO's "mouse", renamed
    for box, mask in found["computer mouse"]:
        assert mask is None and 0 <= box[0] <= box[2] <= 40 and 0 <= box[1] <= box[3] <= 30 and 0 < box[4] < 1


def test_the_metadata_is_genevals_553_prompts_and_bad_rows_are_named():
    rows = geneval_rows([json.loads(line) for line in METADATA.read_text().splitlines()], {})
    assert len(rows) == 553 and rows[0]["id"] == "00000" and rows[0]["text"] == "a photo of a bench"
    assert {r["tag"] for r in rows} == {"single_object", "two_object", "counting", "colors", "position", "color_attr"}
    with pytest.raises(ValueError, match="row 1: include class 'unicorn'"):
        geneval_rows([{"tag": "single_object", "prompt": "x", "include": [{"class": "cat", "count": 1}]},
                      {"tag": "single_object", "prompt": "y", "include": [{"class": "unicorn", "count": 1}]}], {})
    with pytest.raises(ValueError, match="row 0: include color 'teal'"):
        geneval_rows([{"tag": "colors", "prompt": "x", "include": [{"class": "cat", "count": 1, "color": "teal"}]}], {})


# one prompt of each task from GenEval's file, and what a detector saw in its images
PROMPT_LINES = (1, 100, 200, 300, 400, 500)
RECORDED = {"00000": {"bench": [[2, 2, 10, 10, 0.5]]},
            "00001": {"toilet": [[0, 0, 8, 8, 0.9]]},  # no computer mouse: wrong
            "00002": {"orange": [[0, 0, 3, 3, 0.95], [5, 0, 8, 3, 0.95], [10, 0, 13, 3, 0.95], [0, 9, 3, 12, 0.5]]},
            "00003": {"dining table": [[0, 0, 16, 16, 0.8]]},
            "00004": {"sink": [[4, 12, 12, 16, 0.9]], "tie": [[4, 0, 12, 4, 0.9]]},
            "00005": {"boat": [[0, 0, 8, 8, 0.9]], "hot dog": [[8, 8, 16, 16, 0.9]]}}


def test_geneval_runs_end_to_end_on_the_tiny_diffusion_model(tmp_path, one_torch_thread):
    from bench_fixtures import generator_config

    from mmrl.experiments.bench.harness import BenchRun, run_bench
    lines = METADATA.read_text().splitlines()
    data = tmp_path / "geneval.jsonl"
    data.write_text("".join(lines[n - 1] + "\n" for n in PROMPT_LINES))
    (tmp_path / "recorded.json").write_text(json.dumps(RECORDED))
    (tmp_path / "clip.json").write_text(json.dumps(TINY_CLIP))
    cfg = generator_config("geneval", "t2i_demo")
    options = {"detector": "recorded", "detector_path": str(tmp_path / "recorded.json"), "clip_pretrained": None,
               "clip_model_config": str(tmp_path / "clip.json"), "device": "cpu"}
    summary = run_bench(BenchRun("geneval", tmp_path, cfg, "tiny:pixel-flow-unet", data=str(data), options=options))
    figures = summary["figures"]
    assert summary["samples_per_prompt"] == 4 and figures["single_object"]["n"] == 1
    assert (figures["single_object"]["value"], figures["two_object"]["value"]) == (1.0, 0.0)
    assert (figures["counting"]["value"], figures["position"]["value"]) == (1.0, 1.0)
    scores = [json.loads(line) for line in (tmp_path / "bench" / "geneval" / "scores.jsonl").read_text().splitlines()]
    by_task = {}
    for s in scores:
        for task, value in s["values"].items():
            if value is not None:
                by_task.setdefault(task, []).append(value)
    assert summary["headline"]["figure"] == "overall" and len(by_task) == 6
    assert summary["headline"]["value"] == pytest.approx(np.mean([np.mean(v) for v in by_task.values()]))
    assert summary["generation"]["options"]["detector"] == "recorded"
