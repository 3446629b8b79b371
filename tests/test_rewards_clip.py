"""CLIP-based image rewards on a tiny random open_clip model (no download)."""

import json

import pytest
import torch
from mmrl.rewards.clip import AestheticHead, aesthetic, clip_score, image_embeddings, load_clip
from PIL import Image

TINY = {"embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "mmrl-tiny-clip.json"
    path.write_text(json.dumps(TINY))
    return {"model_config": str(path), "pretrained": None, "device": "cpu"}


IMAGES = [Image.new("RGB", (40, 40), c) for c in ((250, 0, 0), (0, 0, 250), (20, 200, 20))]


def test_clip_score_is_the_cosine_and_batch_invariant(tiny):
    prompts = ["red", "blue", "green"]
    scores = clip_score(prompts, IMAGES, batch_size=2, **tiny)
    net, preprocess, tok = load_clip(None, None, tiny["model_config"], "cpu")
    with torch.no_grad():
        img = net.encode_image(torch.stack([preprocess(i) for i in IMAGES]))
        txt = net.encode_text(tok(prompts))
    want = torch.nn.functional.cosine_similarity(img, txt)
    assert torch.allclose(torch.tensor(scores), want, atol=1e-5)
    assert clip_score(prompts[:1], IMAGES[:1], **tiny) == pytest.approx(scores[:1], abs=1e-5)
    assert load_clip(None, None, tiny["model_config"], "cpu") is load_clip(None, None, tiny["model_config"], "cpu")


def test_aesthetic_linear_and_mlp_heads(tiny, tmp_path):
    g = torch.Generator().manual_seed(0)
    linear = {"weight": torch.randn(1, 16, generator=g), "bias": torch.tensor([5.0])}
    mlp = {f"layers.{i}.weight": torch.randn(o, n, generator=g) for i, (n, o) in
           zip((0, 2, 4, 6, 7), ((16, 12), (12, 8), (8, 6), (6, 4), (4, 1)))}
    mlp.update({k.replace("weight", "bias"): torch.zeros(v.shape[0]) for k, v in list(mlp.items())})
    net, preprocess, _ = load_clip(None, None, tiny["model_config"], "cpu")
    emb = image_embeddings(net, preprocess, IMAGES, 8, "cpu")
    assert torch.allclose(emb.norm(dim=-1), torch.ones(3))
    for name, state in (("linear.pth", linear), ("mlp.pth", mlp)):
        torch.save(state, tmp_path / name)
        got = aesthetic(["x"] * 3, IMAGES, head=str(tmp_path / name), **tiny)
        x = emb
        for key in sorted((k for k in state if k.endswith("weight")), key=lambda k: (len(k), k)):
            x = x @ state[key].T + state[key.replace("weight", "bias")]
        assert torch.allclose(torch.tensor(got), x.squeeze(-1), atol=1e-5)
    assert AestheticHead(mlp).layers[-1].out_features == 1
    with pytest.raises(FileNotFoundError, match="missing.pth"):
        aesthetic(["x"], IMAGES[:1], head=str(tmp_path / "missing.pth"), **tiny)
    with pytest.raises(ValueError, match="args.head"):
        aesthetic(["x"], IMAGES[:1], **tiny)


def test_pickscore_from_a_local_clip_model(tmp_path):
    from mmrl.rewards.clip import pickscore
    from mmrl.tasks.demos.tiny_models import char_tokenizer
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    tok = char_tokenizer()
    tok.padding_side = "right"  # as CLIP tokenizers pad
    config = CLIPConfig(text_config={"vocab_size": len(tok), "hidden_size": 16, "intermediate_size": 32,
                                     "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
                        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
                        projection_dim=8)
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    got = pickscore(["red", "blue"], IMAGES[:2], path=str(tmp_path), device="cpu", batch_size=1)
    net = CLIPModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        pixels = CLIPImageProcessor.from_pretrained(tmp_path)(images=IMAGES[:2], return_tensors="pt")["pixel_values"]
        img = net.get_image_features(pixel_values=pixels).pooler_output
        txt = net.get_text_features(**tok(["red", "blue"], padding=True, return_tensors="pt")).pooler_output
    want = net.logit_scale.exp() * torch.nn.functional.cosine_similarity(img, txt) / 26
    assert torch.allclose(torch.tensor(got), want, atol=1e-5)
    with pytest.raises(ValueError, match="args.path"):
        pickscore(["x"], IMAGES[:1])
