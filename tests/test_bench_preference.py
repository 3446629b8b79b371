"""HPSv2's benchmark, PickScore on Pick-a-Pic and ImageReward's benchmark (tasks/bench/preference.py):
each scorer against the score computed here from the model's own embeddings, the rows' checks, and
the benchmarks end to end on the tiny diffusion model (the ImageReward package replaced by a
stand-in module where it is not installed)."""

import json
import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.tasks.bench.preference import (
    IMAGEREWARD_PROMPTS,
    hps_bench_score,
    hps_prompt_rows,
    hps_rows,
    imagereward_bench_score,
    pickscore_bench_score,
)

TINY_CLIP = {"embed_dim": 16,
             "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
             "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}
IMAGES = [Image.new("RGB", (40, 40), c) for c in ((250, 0, 0), (0, 0, 250))]


def tiny_hps(folder):
    """A tiny open_clip model config and a checkpoint of its weights (as the HPS checkpoint is one of ViT-H-14's)."""
    import open_clip
    config = folder / "mmrl-tiny-hps.json"
    config.write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(config)
    torch.manual_seed(3)
    net = open_clip.create_model("mmrl-tiny-hps")
    torch.save({"state_dict": net.state_dict()}, folder / "hps.pt")
    return net, {"hps_checkpoint": str(folder / "hps.pt"), "hps_model_config": str(config), "device": "cpu"}


def test_hps_bench_score_is_100_times_the_cosine_of_the_checkpoints_embeddings(tmp_path):
    import open_clip
    net, options = tiny_hps(tmp_path)
    got = hps_bench_score(["a red square", "a blue square"], IMAGES, [options["hps_checkpoint"]] * 2, ["unused"] * 2,
                          [options["hps_model_config"]] * 2, ["cpu"] * 2)
    _, _, preprocess = open_clip.create_model_and_transforms("mmrl-tiny-hps")
    with torch.no_grad():
        img = net.eval().encode_image(torch.stack([preprocess(i) for i in IMAGES]))
        txt = net.encode_text(open_clip.get_tokenizer("mmrl-tiny-hps")(["a red square", "a blue square"]))
    assert np.allclose(got, 100 * torch.nn.functional.cosine_similarity(img, txt).numpy(), atol=1e-3)
    with pytest.raises(ValueError, match="--option hps_checkpoint"):
        hps_bench_score(["x"], IMAGES[:1], [None], ["ViT-H-14"], [None], [None])


def test_pickscore_bench_score_is_the_raw_pickscore(tmp_path):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    from mmrl.tasks.demos.tiny_models import char_tokenizer
    tok = char_tokenizer()
    tok.padding_side = "right"
    config = CLIPConfig(text_config={"vocab_size": len(tok), "hidden_size": 16, "intermediate_size": 32,
                                     "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
                        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8}, projection_dim=8)
    torch.manual_seed(0)
    net = CLIPModel(config).eval()
    net.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    got = pickscore_bench_score(["red", "blue"], IMAGES, [str(tmp_path)] * 2, [None] * 2, ["cpu"] * 2)
    with torch.no_grad():
        pixels = CLIPImageProcessor.from_pretrained(tmp_path)(images=IMAGES, return_tensors="pt")["pixel_values"]
        img = net.get_image_features(pixel_values=pixels).pooler_output
        txt = net.get_text_features(**tok(["red", "blue"], padding=True, return_tensors="pt")).pooler_output
        want = net.logit_scale.exp() * torch.nn.functional.cosine_similarity(img, txt)
    assert np.allclose(got, want.numpy(), atol=1e-4)


@pytest.fixture
def image_reward_package(monkeypatch):
    """A stand-in for the image-reward package (not installable beside mmrl's timm): its load and score."""
    module = types.ModuleType("ImageReward")
    loaded = []

    class Model:
        def score(self, prompt, image):
            return len(prompt) + float(np.asarray(image)[..., 0].mean()) / 255

    def load(name, device):
        loaded.append((name, device))
        return Model()
    module.load = load
    monkeypatch.setitem(sys.modules, "ImageReward", module)
    from mmrl.tasks.bench import preference
    preference._imagereward_model.cache_clear()
    yield loaded
    preference._imagereward_model.cache_clear()


def test_imagereward_bench_score_calls_the_package(image_reward_package):
    got = imagereward_bench_score(["ab", {"prompt": "abc"}], IMAGES, ["ImageReward-v1.0"] * 2, ["cpu"] * 2)
    assert got == pytest.approx([2 + 250 / 255, 3.0])
    assert image_reward_package == [("ImageReward-v1.0", "cpu")]


def test_prompt_sets_and_their_checks(tmp_path):
    prompts = json.loads(IMAGEREWARD_PROMPTS.read_text())
    assert len(prompts) == 100 and prompts[0]["id"] == "005695-0057"
    for style in ("anime", "concept-art", "paintings", "photo"):
        (tmp_path / f"{style}.json").write_text(json.dumps([f"{style} one", f"{style} two"]))
    rows = hps_rows(hps_prompt_rows(tmp_path), {})
    assert [r["id"] for r in rows[:3]] == ["anime-00000", "anime-00001", "concept-art-00000"] and rows[2]["style"] == "concept-art"
    with pytest.raises(ValueError, match="row 0: style 'cartoon'"):
        hps_rows([{"prompt": "x", "style": "cartoon"}], {})


def test_hps_and_imagereward_benchmarks_run_end_to_end_on_the_tiny_diffusion_model(tmp_path, image_reward_package,
                                                                                   one_torch_thread):
    from bench_fixtures import generator_config

    from mmrl.experiments.bench.harness import BenchRun, run_bench
    _, options = tiny_hps(tmp_path)
    data = tmp_path / "hps.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{s} of a cat", "style": s}) + "\n"
                            for s in ("anime", "concept-art", "paintings", "photo") for _ in range(2)))
    cfg = generator_config("hps_bench", "t2i_demo")
    summary = run_bench(BenchRun("hps_bench", tmp_path, cfg, "tiny:pixel-flow-unet", data=str(data), options=options))
    assert summary["headline"]["n"] == 8 and set(summary["categories"]["style"]) == {"anime", "concept-art", "paintings", "photo"}
    scores = [json.loads(x)["values"]["hps"] for x in (tmp_path / "bench/hps_bench/scores.jsonl").read_text().splitlines()]
    assert summary["headline"]["value"] == pytest.approx(np.mean(scores)) and all(-100 <= s <= 100 for s in scores)
    ir = run_bench(BenchRun("imagereward_bench", tmp_path, cfg, "tiny:pixel-flow-unet", num_prompts=2, options={"device": "cpu"}))
    assert ir["samples_per_prompt"] == 10 and ir["smoke_subset"] and ir["headline"]["n"] == 2
    lengths = [len(p["prompt"]) for p in json.loads(IMAGEREWARD_PROMPTS.read_text())[:2]]
    assert np.mean(lengths) <= ir["headline"]["value"] <= np.mean(lengths) + 1  # the stand-in's length + red share
