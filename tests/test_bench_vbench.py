"""VBench (tasks/bench/vbench*.py): the final score from normalised dimensions, each computed
dimension's formula on hand-written videos and flows (imaging quality on a small random MUSIQ of
pyiqa's class, skipped without the imaging extra), the suite's checks, and the benchmark end to end
on the tiny video model with tiny DINO, CLIP, aesthetic head and MUSIQ (RAFT's dynamic degree is
tested with a stand-in flow). The formulas were also run beside VBench's code on identical inputs
(docs/bench.md#vbench-vbench)."""

import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from mmrl.core.bench_stats import figure_table
from mmrl.registry import BENCHMARKS
from mmrl.tasks.bench import vbench_dimensions as dims
from mmrl.tasks.bench.vbench import NORMALISATION, SUITE, vbench_rows

TINY_CLIP = {"embed_dim": 16,
             "vision_cfg": {"image_size": 224, "layers": 1, "width": 32, "patch_size": 32, "head_width": 16},
             "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


def test_the_final_score_is_vbenchs_weighted_mean_of_normalised_dimensions():
    rng = np.random.default_rng(1)
    values = {d: float(rng.uniform(lo, hi)) for d, (lo, hi) in NORMALISATION.items()}
    scored = [{"id": d, "k": 0, "categories": {}, "values": {d: v}} for d, v in values.items()]
    table = figure_table(scored, BENCHMARKS.get("vbench").figures)
    norm = {d: (v - NORMALISATION[d][0]) / (NORMALISATION[d][1] - NORMALISATION[d][0]) for d, v in values.items()}
    quality = ["subject_consistency", "background_consistency", "temporal_flickering", "motion_smoothness",
               "aesthetic_quality", "imaging_quality"]
    q = (sum(norm[d] for d in quality) + 0.5 * norm["dynamic_degree"]) / 6.5
    s = sum(norm[d] for d in values if d not in quality and d != "dynamic_degree") / 9
    assert table["quality_score"]["value"] == pytest.approx(q) and table["semantic_score"]["value"] == pytest.approx(s)
    assert table["total_score"]["value"] == pytest.approx((4 * q + s) / 5)
    assert table["scene_normalized"]["value"] == pytest.approx(values["scene"] / 0.8222)
    scored = [s for s in scored if s["id"] != "motion_smoothness"]  # not computed: no quality or total score
    table = figure_table(scored, BENCHMARKS.get("vbench").figures)
    assert math.isnan(table["quality_score"]["value"]) and math.isnan(table["total_score"]["value"])
    assert table["partial_quality_score"]["value"] == pytest.approx(
        (norm["subject_consistency"] + norm["background_consistency"] + norm["temporal_flickering"]
         + norm["aesthetic_quality"] + norm["imaging_quality"] + 0.5 * norm["dynamic_degree"]) / 5.5)


def test_temporal_flickering_and_consistency_by_hand():
    still = np.full((4, 6, 6, 3), 77, dtype=np.uint8)
    assert dims.temporal_flickering(still) == 1.0
    blink = np.stack([np.zeros((6, 6, 3)), np.full((6, 6, 3), 255.0), np.zeros((6, 6, 3))]).astype(np.uint8)
    assert dims.temporal_flickering(blink) == 0.0
    assert dims.temporal_flickering(blink.astype(np.float32) / 255) == 0.0  # float frames in [0, 1] alike
    f = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # t=1: prev 0, first 0 -> 0; t=2: prev cos45, first cos45 -> 0.7071; mean 0.3536
    assert dims.consistency(f) == pytest.approx(math.sqrt(0.5) / 2)
    assert dims.consistency(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])) == 0.0  # negative cosines count as 0


def test_dynamic_degree_takes_the_top_5_percent_of_the_flow_and_counts_pairs_over_the_threshold():
    flow = torch.zeros(2, 10, 10)
    flow[0, 0, :5] = 3.0  # 5 of 100 pixels move by 3: the top 5%
    flow[1, 0, :5] = 4.0
    assert dims.top_flow(flow) == pytest.approx(5.0)
    # 16 frames of 256 x 256: threshold 6, 4 pairs needed
    assert dims.moves([7, 7, 7, 1, 7], 256, 256, 16) and not dims.moves([7, 7, 7, 1, 1], 256, 256, 16)
    assert dims.moves([3.1, 3.1], 128, 300, 16) is False and dims.moves([3.1] * 4, 128, 300, 16)  # threshold 3


def test_the_suite_is_vbenchs_946_prompts_and_bad_rows_are_named():
    rows = vbench_rows(json.loads(SUITE.read_text()), {})
    assert len(rows) == 946 and sum("subject_consistency" in r["dimensions"] for r in rows) == 72
    with pytest.raises(ValueError, match=r"row 1: dimension \['beauty'\]"):
        vbench_rows([{"prompt_en": "a cat", "dimension": ["scene"]}, {"prompt_en": "a dog", "dimension": ["beauty"]}], {})


def test_a_dimension_missing_its_model_says_which_option():
    from mmrl.tasks.bench.vbench import OPTIONS, vbench
    columns = {k: [v] for k, v in OPTIONS.items()}
    with pytest.raises(ValueError, match="dynamic_degree needs --option raft_path"):
        vbench(["p"], [np.zeros((2, 8, 8, 3), np.uint8)], [["dynamic_degree"]], "dynamic_degree", **columns)
    columns["compute"] = ["temporal_flickering,motion_smoothness"]
    with pytest.raises(ValueError, match="names \\['motion_smoothness'\\]"):
        vbench(["p"], [np.zeros((2, 8, 8, 3), np.uint8)], [["motion_smoothness"]], "motion_smoothness", **columns)


def test_dynamic_degree_samples_frames_by_fps_and_scales_small_frames_up_for_the_flow(monkeypatch):
    calls = []

    class Flow(torch.nn.Module):  # a RAFT that sees everything move `speed` pixels to the right
        def __init__(self, speed):
            super().__init__()
            self.speed = speed

        def forward(self, a, b, num_flow_updates):
            calls.append((tuple(a.shape), num_flow_updates))
            flow = torch.zeros(1, 2, *a.shape[-2:])
            flow[:, 0] = self.speed
            return [flow]
    video = np.zeros((32, 20, 30, 3), np.uint8)
    monkeypatch.setattr(dims, "raft_model", lambda path, device: Flow(4.0))  # threshold 6 x 128 / 256 = 3
    assert dims.dynamic_degree(video, 16.0, "raft.pth", "cpu") == 1.0
    # 16 of the 32 frames (every round(16 / 8) = 2nd), 15 pairs, each 128 x 192 padded to multiples of 8
    assert len(calls) == 15 and calls[0] == ((1, 3, 128, 192), 20)
    monkeypatch.setattr(dims, "raft_model", lambda path, device: Flow(2.0))
    assert dims.dynamic_degree(video, 16.0, "raft.pth", "cpu") == 0.0


# a MUSIQ of pyiqa's architecture small enough for a test (the SPAQ checkpoint's is pyiqa's defaults)
TINY_MUSIQ = {"hidden_size": 32, "mlp_dim": 32, "num_heads": 2, "num_layers": 1, "longer_side_lengths": [64]}


def tiny_musiq(folder):
    """A random-weight MUSIQ saved as a checkpoint file and its architecture's JSON: (musiq_path, musiq_arch)."""
    from pyiqa.archs.musiq_arch import MUSIQ
    torch.manual_seed(0)
    torch.save(MUSIQ(pretrained=False, **TINY_MUSIQ).state_dict(), folder / "musiq.pth")
    (folder / "musiq.json").write_text(json.dumps(TINY_MUSIQ))
    return str(folder / "musiq.pth"), str(folder / "musiq.json")


def test_imaging_quality_is_musiq_of_each_frame_over_100_after_vbenchs_resize(tmp_path):
    pytest.importorskip("pyiqa", reason="the imaging extra")
    from pyiqa.archs.musiq_arch import MUSIQ
    from torchvision.transforms import Resize
    path, arch = tiny_musiq(tmp_path)
    musiq = MUSIQ(pretrained_model_path=path, **TINY_MUSIQ)
    musiq.training = False  # as VBench sets it
    video = np.random.default_rng(0).integers(0, 256, (2, 40, 600, 3), dtype=np.uint8)
    frames = torch.from_numpy(video).permute(0, 3, 1, 2).float()
    # VBench's 'longer' preprocessing: longer side 600 > 512, so Resize((int(512 / 600 x 40), 512)) without antialias
    frames = Resize(size=(int(512 / 600 * 40), 512), antialias=False)(frames) / 255.0
    assert torch.allclose(dims.musiq_frames(video), frames, atol=1e-5)
    with torch.no_grad():
        want = sum(float(musiq(f[None])) for f in frames) / len(frames) / 100
    assert dims.imaging_quality(video, path, arch, "cpu") == pytest.approx(want, rel=1e-5)
    small = video[:, :, :30]  # under 512: not resized
    assert torch.equal(dims.musiq_frames(small), torch.from_numpy(small).permute(0, 3, 1, 2).float() / 255)
    with pytest.raises(FileNotFoundError, match="musiq_path '/no/musiq.pth'"):
        dims.musiq_model("/no/musiq.pth", None, "cpu")


def _tiny_scorers(folder):
    """Tiny random DINO (transformers ViT), CLIP (open_clip) and aesthetic head files, and MUSIQ's where
    pyiqa (the imaging extra) is installed."""
    from transformers import ViTConfig, ViTModel
    torch.manual_seed(0)
    ViTModel(ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, image_size=224,
                       patch_size=32), add_pooling_layer=False).save_pretrained(folder / "dino")
    (folder / "clip.json").write_text(json.dumps(TINY_CLIP))
    torch.save({"weight": torch.randn(1, 16) / 4, "bias": torch.tensor([5.0])}, folder / "head.pth")
    options = {"dino_path": str(folder / "dino"), "clip_pretrained": None, "clip_model_config": str(folder / "clip.json"),
               "aesthetic_pretrained": None, "aesthetic_model_config": str(folder / "clip.json"),
               "aesthetic_head": str(folder / "head.pth"), "device": "cpu", "compute": ",".join(E2E_DIMENSIONS)}
    if "imaging_quality" in E2E_DIMENSIONS:
        options["musiq_path"], options["musiq_arch"] = tiny_musiq(folder)
    return options


HAS_PYIQA = importlib.util.find_spec("pyiqa") is not None
E2E_DIMENSIONS = ("subject_consistency", "background_consistency", "temporal_flickering", "aesthetic_quality") + (
    ("imaging_quality",) if HAS_PYIQA else ())  # RAFT left out: 13 s a pair on 2 loaded cores


def test_vbench_runs_end_to_end_on_the_tiny_video_model(tmp_path, one_torch_thread):
    from bench_fixtures import generator_config

    from mmrl.experiments.bench.harness import BenchRun, run_bench
    suite = json.loads(SUITE.read_text())
    picked = [next(r for r in suite if d in r["dimension"]) for d in E2E_DIMENSIONS]
    data = tmp_path / "vbench.json"
    data.write_text(json.dumps(picked))
    cfg = generator_config("vbench", "t2v_demo")
    summary = run_bench(BenchRun("vbench", tmp_path, cfg, "tiny:pixel-flow-video", data=str(data),
                                 options=_tiny_scorers(tmp_path)))
    figures = summary["figures"]
    assert summary["samples_per_prompt"] == 5
    for d in E2E_DIMENSIONS:  # a random MUSIQ's score is any number: only the others are bounded
        assert figures[d]["n"] >= 1 and (d == "imaging_quality" or 0 <= figures[d]["value"] <= 1), d
        assert math.isfinite(figures[d]["value"]), d
    assert figures["dynamic_degree"]["n"] == 0  # not asked for: no figure
    assert math.isnan(figures["motion_smoothness"]["value"]) and math.isnan(figures["total_score"]["value"])
    assert math.isnan(figures["partial_quality_score"]["value"])  # dynamic degree is one of its parts
    assert figures["temporal_flickering_normalized"]["value"] == pytest.approx(
        (figures["temporal_flickering"]["value"] - 0.6293) / (1 - 0.6293))
