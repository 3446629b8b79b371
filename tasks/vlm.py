"""Vision-language models as policies: one unit per completion token, images in the prompt.

Any ``AutoModelForImageTextToText`` with its ``AutoProcessor`` (Qwen2.5-VL, Qwen2-VL, Qwen3-VL,
LLaVA-style, Gemma 3). Each prompt is processed on its own (chat template with one image slot per
image, then the processor), so a row's inputs never depend on the other rows of a batch; the
per-token processor outputs (``mm_token_type_ids``, ``token_type_ids``) are left-padded with the
ids, the others (``pixel_values``, ``image_grid_thw``, ...) are kept per prompt and joined for each
batch. Generation and the completion log-probs see exactly the same processor outputs; the
multimodal rotary positions are computed by the model from ids, grids and attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from mmrl.registry import ADAPTERS

from .causal_lm import DTYPES, CausalLMConfig, CausalLMPolicy
from .tiny_models import TINY_MODELS

TOKEN_KEYS = ("input_ids", "attention_mask")


@dataclass
class VLMConfig(CausalLMConfig):
    image_column: str = "image"
    min_pixels: int | None = None
    max_pixels: int | None = None


def load_image(image: Any):
    """A PIL image in RGB from a path or a PIL image; a broken file fails naming its path."""
    from PIL import Image, UnidentifiedImageError
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, (str, Path)):
        try:
            with Image.open(image) as im:
                return im.convert("RGB")
        except (FileNotFoundError, UnidentifiedImageError, OSError) as e:
            raise ValueError(f"image {str(image)!r} cannot be read: {e}") from e
    raise TypeError(f"an image must be a path or a PIL image, got {type(image).__name__}")


@ADAPTERS.register("vlm")
class VLMPolicy(CausalLMPolicy):
    Config = VLMConfig

    def _load(self, cfg: VLMConfig) -> None:
        if cfg.model.startswith("tiny:"):
            self.model, self.processor = TINY_MODELS.get(cfg.model[5:])(**cfg.tiny_args)
            self.model.to(DTYPES[cfg.dtype])
        else:
            from transformers import AutoModelForImageTextToText, AutoProcessor
            kwargs = {k: v for k, v in (("min_pixels", cfg.min_pixels), ("max_pixels", cfg.max_pixels)) if v}
            self.processor = AutoProcessor.from_pretrained(cfg.tokenizer or cfg.model,
                                                           trust_remote_code=cfg.trust_remote_code, **kwargs)
            self.model = AutoModelForImageTextToText.from_pretrained(
                cfg.model, dtype=DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation,
                trust_remote_code=cfg.trust_remote_code)
        self.tokenizer = self.processor.tokenizer

    def save_pretrained(self, model: nn.Module, path: Path) -> None:
        model.save_pretrained(path, safe_serialization=True)
        self.processor.save_pretrained(path)

    def suppressed_tokens(self) -> list[int]:
        """The multimodal placeholder tokens (image / video / audio pads, vision start and end):
        sampled inside a completion they would be read as slots for features that do not exist."""
        cfg = self.model.config
        names = [k for k in cfg.to_dict() if k.endswith("_token_id") and
                 any(m in k for m in ("image", "video", "vision", "audio"))]
        return sorted({int(getattr(cfg, k)) for k in names if isinstance(getattr(cfg, k), int)})

    def images_of(self, row: Any) -> list:
        if not isinstance(row, dict) or row.get(self.cfg.image_column) is None:
            return []
        value = row[self.cfg.image_column]
        return [load_image(v) for v in (value if isinstance(value, (list, tuple)) else [value])]

    def _encode_prompts(self, prompts: Sequence[Any]) -> dict[str, Any]:
        per_token: dict[str, list[Tensor]] = {}
        per_prompt: dict[str, list[Tensor]] = {}
        ids = []
        for row in prompts:
            images = self.images_of(row)
            text = self.prompt_of(row)
            content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
            messages = [{"role": "user", "content": content}]
            if self.cfg.system_prompt:
                messages = [{"role": "system", "content": self.cfg.system_prompt}] + messages
            chat = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            enc = self.processor(text=[chat], images=images or None, return_tensors="pt")
            ids.append(enc["input_ids"][0])
            for key, value in enc.items():
                if key in TOKEN_KEYS:
                    continue
                if value.dim() == 2 and value.shape == enc["input_ids"].shape:
                    per_token.setdefault(key, []).append(value[0])
                else:
                    per_prompt.setdefault(key, []).append(value)
        width = max(len(x) for x in ids)
        left_pad = lambda xs, v: torch.stack([nn.functional.pad(x, (width - len(x), 0), value=v)  # noqa: E731
                                              for x in xs])
        out: dict[str, Any] = {
            "prompt_ids": left_pad(ids, self.tokenizer.pad_token_id),
            "prompt_mask": left_pad([torch.ones_like(x) for x in ids], 0),
        }
        out.update({f"prompt_{k}": left_pad(v, 0) for k, v in per_token.items()})
        out.update(per_prompt)
        return out

    def _model_inputs(self, rows: dict[str, Any], completion_ids: Tensor | None = None,
                      completion_mask: Tensor | None = None) -> dict[str, Tensor]:
        inputs = super()._model_inputs(rows, completion_ids, completion_mask)
        inputs.pop("position_ids", None)  # multimodal rotary positions come from ids, grids and mask
        device, dtype = self.device, next(self.model.parameters()).dtype
        width = 0 if completion_ids is None else completion_ids.shape[1]
        for key, value in rows.items():
            if key in ("prompt_ids", "prompt_mask", "completion_ids"):
                continue
            if key.startswith("prompt_"):
                inputs[key[len("prompt_"):]] = nn.functional.pad(value, (0, width)).to(device)
            else:
                joined = torch.cat(list(value), dim=0).to(device)
                inputs[key] = joined.to(dtype) if joined.is_floating_point() else joined
        return inputs
