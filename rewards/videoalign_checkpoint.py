"""Loading the VideoAlign (VideoReward, Liu et al. 2025) checkpoint into a stock transformers
Qwen2-VL plus its reward head.

The published checkpoint (KlingTeam/VideoReward) is a directory with ``model_config.json``
(the data, model, LoRA and inference settings) and ``checkpoint-STEP/model.pth``, the full state
dict of the PEFT-wrapped training model: Qwen2-VL-2B-Instruct with three added special tokens
(``<|VQ_reward|>``, ``<|MQ_reward|>``, ``<|TA_reward|>``), LoRA adapters (``lora_r``,
``lora_alpha`` in ``peft_lora_config``) on the language model's linear layers, and ``rm_head``,
a bias-free Linear(hidden, output_dim) read at the special tokens. Loading here merges each
LoRA pair into its base weight, W + (alpha / r) B A (alpha / sqrt(r) with ``use_rslora``), maps
the pre-4.52 transformers names (``model.layers``, ``visual``) onto the current
(``model.language_model``, ``model.visual``), and checks that every weight found a place.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

SPECIAL_TOKENS = {"VQ": "<|VQ_reward|>", "MQ": "<|MQ_reward|>", "TA": "<|TA_reward|>"}
LEGACY_NAMES = ((re.compile(r"^visual\."), "model.visual."),
                (re.compile(r"^model\.(?!language_model\.|visual\.)"), "model.language_model."))


@dataclass
class VideoAlignModel:
    """The loaded reward model: the Qwen2-VL, its processor, the head [output_dim, hidden], the
    special token ids by head, the checkpoint's settings (model_config.json) and the dtype."""

    model: Any
    processor: Any
    rm_head: nn.Linear
    token_ids: dict[str, int]
    settings: dict[str, Any]


def latest_checkpoint(path: Path) -> Path:
    """``checkpoint-STEP/model.pth`` of the highest STEP under `path` (as the authors' loader)."""
    steps = sorted(path.glob("checkpoint-*/model.pth"), key=lambda p: int(p.parent.name.split("-")[-1]))
    if not steps:
        raise FileNotFoundError(f"videoalign: no checkpoint-*/model.pth under {str(path)!r}")
    return steps[-1]


def merged_state_dict(state: dict[str, torch.Tensor], lora: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The PEFT training model's state dict as a plain model's: LoRA pairs merged into their base
    weights, the PEFT prefix and ``.base_layer`` dropped, legacy names mapped (module docstring)."""
    r, alpha = lora.get("lora_r", 1), lora.get("lora_alpha", 1)
    scale = alpha / (math.sqrt(r) if lora.get("use_rslora") else r)
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        a_key = key.replace(".base_layer.weight", ".lora_A.default.weight")
        if key.endswith(".base_layer.weight") and a_key in state:
            down, up = state[a_key].float(), state[a_key.replace(".lora_A.", ".lora_B.")].float()
            value = (value.float() + scale * up @ down).to(value.dtype)
        for pattern, new in LEGACY_NAMES:
            name = pattern.sub(new, name)
        out[name] = value
    return out


def _tokenizer_dir(path: Path, checkpoint: Path) -> Path | None:
    for candidate in (checkpoint.parent / "tokenizer", path / "tokenizer"):
        if (candidate / "tokenizer_config.json").is_file():
            return candidate
    return None


def load_videoalign(path: str, base: str | None, device: str, dtype: torch.dtype) -> VideoAlignModel:
    """The checkpoint directory `path` on the Qwen2-VL at `base` (a local directory; default the
    ``model_name_or_path`` of its model_config.json)."""
    from transformers import AutoProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration
    root = Path(path)
    config_file = root / "model_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"videoalign: {str(config_file)!r} does not exist (args.path: the VideoReward "
                                "checkpoint directory)")
    settings = json.loads(config_file.read_text())
    base = base or settings.get("model_config", {}).get("model_name_or_path")
    if not base or not Path(base).is_dir():
        raise FileNotFoundError(f"videoalign: the base Qwen2-VL {base!r} is not a local directory (args.base)")
    checkpoint = latest_checkpoint(root)
    processor = AutoProcessor.from_pretrained(base)
    tokenizer_dir = _tokenizer_dir(root, checkpoint)
    if tokenizer_dir is not None:
        processor.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    else:
        processor.tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS.values())})
    processor.tokenizer.padding_side = "right"
    model = Qwen2VLForConditionalGeneration.from_pretrained(base, dtype=dtype)
    model.resize_token_embeddings(len(processor.tokenizer))
    state = merged_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True),
                              settings.get("peft_lora_config", {}))
    head_weight = state.pop("rm_head.weight")
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"videoalign: {checkpoint} does not fit the Qwen2-VL at {base!r}: missing "
                         f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}")
    rm_head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
    rm_head.weight.data.copy_(head_weight)
    ids = {head: processor.tokenizer.convert_tokens_to_ids(token) for head, token in SPECIAL_TOKENS.items()}
    model = model.to(device).eval().requires_grad_(False)
    return VideoAlignModel(model, processor, rm_head.to(device, dtype).requires_grad_(False), ids, settings)
