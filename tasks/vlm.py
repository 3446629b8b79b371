"""Vision-language models as policies: any ``AutoModelForImageTextToText`` with its
``AutoProcessor`` (Qwen2.5-VL, Qwen2-VL, Qwen3-VL, LLaVA-style, Gemma 3); images from paths or
PIL images in the data set's `image_column` (one or a list per row)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrl.registry import ADAPTERS

from .causal_lm import DTYPES, CausalLMConfig
from .multimodal import MultimodalPolicy, column_values


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
class VLMPolicy(MultimodalPolicy):
    Config = VLMConfig

    def _load_pretrained(self, cfg: VLMConfig) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor
        kwargs = {k: v for k, v in (("min_pixels", cfg.min_pixels), ("max_pixels", cfg.max_pixels)) if v}
        self.processor = AutoProcessor.from_pretrained(cfg.tokenizer or cfg.model,
                                                       trust_remote_code=cfg.trust_remote_code, **kwargs)
        self.model = AutoModelForImageTextToText.from_pretrained(
            cfg.model, dtype=DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation,
            trust_remote_code=cfg.trust_remote_code)

    def _media(self, row: Any) -> tuple[list[dict], dict[str, Any]]:
        images = [load_image(v) for v in column_values(row, self.cfg.image_column)]
        return [{"type": "image"} for _ in images], {"images": images or None}
