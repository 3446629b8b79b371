"""Image rewards from CLIP models (open_clip), loaded once per (model, weights, device) and run
batched under no grad.

    clip       cos(E_img(image), E_txt(prompt))  (CLIP score without the 100x / clipping)
    aesthetic  head(E_img(image) / ||E_img(image)||)  the LAION aesthetic predictor: a linear or
               MLP head (the improved predictor's Linear stack) on CLIP ViT-L/14 image embeddings;
               weights from `head` (a .pth / .safetensors state dict)
    hpsv2      HPSv2: `clip` with a ViT-H-14 and the HPS checkpoint given as `pretrained` (a path)
    pickscore  exp(logit_scale) cos / 26 with the PickScore_v1 transformers CLIPModel (a local directory)

Each also scores videos frame by frame (`frames`, `aggregate`: rewards/video_frames.py).
`model` is an open_clip model name; `pretrained` an open_clip tag (e.g. "openai") or a local
weights file; `model_config` a JSON model config (registered under its file stem, for
architectures open_clip does not ship). With HF_HUB_OFFLINE=1 only local weights load.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmrl.core.scoring import register_reward

from .outputs import IMAGE
from .video_frames import per_frame


def load_clip(model: str | None, pretrained: str | None, model_config: str | None, device: str):
    """(model, image preprocess, tokenizer), cached; `model_config` (a path) overrides `model`."""
    return _load_clip(None if model_config else model, pretrained, model_config, device)


@functools.lru_cache(maxsize=4)
def _load_clip(model: str | None, pretrained: str | None, model_config: str | None, device: str):
    import open_clip
    if model_config:
        path = Path(model_config)
        if not path.is_file():
            raise FileNotFoundError(f"clip reward: model_config {model_config!r} does not exist")
        json.loads(path.read_text())  # a clear error for a broken file before open_clip reads it
        open_clip.add_model_config(path)
        model = path.stem
    if pretrained and pretrained.endswith((".pt", ".pth", ".bin", ".safetensors")) and not Path(pretrained).is_file():
        raise FileNotFoundError(f"clip reward: pretrained weights {pretrained!r} do not exist")
    net, _, preprocess = open_clip.create_model_and_transforms(model, pretrained=pretrained or None, device=device)
    return net.eval().requires_grad_(False), preprocess, open_clip.get_tokenizer(model)


def _device(device: str | None) -> str:
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


@torch.no_grad()
def image_embeddings(net, preprocess, images: list, batch_size: int, device: str) -> torch.Tensor:
    """L2-normalised image embeddings [N, D], fp32."""
    out = []
    for i in range(0, len(images), batch_size):
        pixels = torch.stack([preprocess(img.convert("RGB")) for img in images[i:i + batch_size]]).to(device)
        out.append(net.encode_image(pixels).float())
    feats = torch.cat(out)
    return feats / feats.norm(dim=-1, keepdim=True).clamp(min=1e-12)


@torch.no_grad()
def text_embeddings(net, tokenizer, texts: list[str], batch_size: int, device: str) -> torch.Tensor:
    out = []
    for i in range(0, len(texts), batch_size):
        out.append(net.encode_text(tokenizer(texts[i:i + batch_size]).to(device)).float())
    feats = torch.cat(out)
    return feats / feats.norm(dim=-1, keepdim=True).clamp(min=1e-12)


def _prompt_text(prompt: Any) -> str:
    return prompt["prompt"] if isinstance(prompt, dict) else str(prompt)


@register_reward("clip", outputs=IMAGE)
@per_frame()
def clip_score(prompts, completions, model: str = "ViT-L-14", pretrained: str | None = "openai",
               model_config: str | None = None, device: str | None = None, batch_size: int = 32, **columns):
    dev = _device(device)
    net, preprocess, tokenizer = load_clip(model, pretrained, model_config, dev)
    img = image_embeddings(net, preprocess, list(completions), batch_size, dev)
    txt = text_embeddings(net, tokenizer, [_prompt_text(p) for p in prompts], batch_size, dev)
    return (img * txt).sum(-1).tolist()


@register_reward("hpsv2", outputs=IMAGE)
@per_frame()
def hpsv2(prompts, completions, pretrained: str | None = None, model: str = "ViT-H-14",
          model_config: str | None = None, device: str | None = None, batch_size: int = 32, **columns):
    """HPSv2(.1): the HPS checkpoint (a local file) on open_clip's ViT-H-14; score = cosine."""
    if not pretrained:
        raise ValueError("hpsv2 needs args.pretrained: the path of the HPS_v2(.1) checkpoint")
    return clip_score(prompts, completions, model=model, pretrained=pretrained, model_config=model_config,
                      device=device, batch_size=batch_size)


class AestheticHead(nn.Module):
    """The LAION aesthetic head: the Linear layers of a state dict, applied in key order (the
    improved predictor's MLP has dropout and no activation between them; v1 is one Linear)."""

    def __init__(self, state: dict[str, torch.Tensor]):
        super().__init__()
        prefixes = sorted({k.rsplit(".", 1)[0] if "." in k else "" for k in state if k.endswith("weight")},
                          key=lambda p: [int(x) if x.isdigit() else x for x in p.split(".")])
        layers = []
        for p in prefixes:
            w = state[f"{p}.weight" if p else "weight"]
            b = state.get(f"{p}.bias" if p else "bias")
            layer = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
            layer.weight.data.copy_(w)
            if b is not None:
                layer.bias.data.copy_(b)
            layers.append(layer)
        if not layers:
            raise ValueError("aesthetic head: the state dict has no Linear weights")
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x)


@functools.lru_cache(maxsize=4)
def load_head(path: str, device: str) -> AestheticHead:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"aesthetic reward: head weights {path!r} do not exist")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file
        state = load_file(str(p))
    else:
        state = torch.load(str(p), map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    return AestheticHead(state).to(device).eval().requires_grad_(False)


@register_reward("aesthetic", outputs=IMAGE)
@per_frame()
def aesthetic(prompts, completions, head: str | None = None, model: str = "ViT-L-14",
              pretrained: str | None = "openai", model_config: str | None = None, device: str | None = None,
              batch_size: int = 32, **columns):
    if not head:
        raise ValueError("aesthetic needs args.head: the path of the LAION aesthetic head weights "
                         "(e.g. sac+logos+ava1-l14-linearMSE.pth)")
    dev = _device(device)
    net, preprocess, _ = load_clip(model, pretrained, model_config, dev)
    mlp = load_head(head, dev)
    emb = image_embeddings(net, preprocess, list(completions), batch_size, dev)
    if emb.shape[1] != mlp.layers[0].in_features:
        raise ValueError(f"aesthetic head {head!r} takes {mlp.layers[0].in_features}-d embeddings; "
                         f"the CLIP model gives {emb.shape[1]}")
    return mlp(emb).squeeze(-1).tolist()


@functools.lru_cache(maxsize=2)
def load_hf_clip(path: str, processor: str | None, device: str):
    """A transformers CLIPModel with its tokenizer and image processor (PickScore), cached."""
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel
    for p in (path, processor):
        if p and not Path(p).exists():
            raise FileNotFoundError(f"pickscore: {p!r} does not exist")
    net = CLIPModel.from_pretrained(path).to(device).eval().requires_grad_(False)
    source = processor or path
    return net, AutoTokenizer.from_pretrained(source), AutoImageProcessor.from_pretrained(source)


def _features(out) -> torch.Tensor:
    """Projected CLIP features (transformers 5 returns them as the output's pooler_output)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


@register_reward("pickscore", outputs=IMAGE)
@per_frame()
def pickscore(prompts, completions, path: str | None = None, processor: str | None = None,
              device: str | None = None, batch_size: int = 32, **columns):
    """PickScore: exp(logit_scale) cos(E_img, E_txt) / 26 with the PickScore_v1 CLIPModel (a local
    directory in `path`; `processor` the CLIP-H processor directory when it is elsewhere)."""
    if not path:
        raise ValueError("pickscore needs args.path: a local directory of the PickScore_v1 CLIPModel")
    dev = _device(device)
    net, tokenizer, image_processor = load_hf_clip(path, processor, dev)
    scores = []
    with torch.no_grad():
        for i in range(0, len(completions), batch_size):
            images = [img.convert("RGB") for img in completions[i:i + batch_size]]
            texts = [_prompt_text(p) for p in prompts[i:i + batch_size]]
            pixels = image_processor(images=images, return_tensors="pt")["pixel_values"].to(dev)
            tokens = tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(dev)
            img = _features(net.get_image_features(pixel_values=pixels))
            txt = _features(net.get_text_features(**tokens))
            img = img / img.norm(dim=-1, keepdim=True)
            txt = txt / txt.norm(dim=-1, keepdim=True)
            scores += (net.logit_scale.exp() * (img * txt).sum(-1) / 26).float().tolist()
    return scores
