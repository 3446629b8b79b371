"""The memory formula of a vision-language model (the vlm adapter's `memory_model`; docs/memory-plan.md):
the causal LM's (tasks/lm/memory_formula.py) over a sequence that also holds the image's tokens, plus
the vision encoder's activations, for the Qwen2-VL and Qwen2.5-VL vision towers. From the model's
configuration and its processor's (no weights):

- the image: one per prompt, as large as the processor makes one (its `max_pixels`, which
  `policy.max_pixels` sets for a pretrained model as the policy loads it; a tiny model's is its
  builder's): `max_pixels // (patch x merge)^2` merged tokens, `merge^2` patches each
  (exact for a square image at the bound, the most any shape gets); its tokens join each row's
  prompt in the decoder (activations, KV cache);
- the vision encoder's activations a training forward keeps, per patch of every row's image, in the
  weights' dtype (read off the saved tensors of the tower's forward at three widths, two depths and
  two MLP widths; docs/benchmarks.md): the pixel values (channels x temporal patch x patch^2, the
  patch embedding's input) and two more; per layer `LAYER_WIDTHS` (hidden, MLP, constant): the two
  norms' inputs and outputs, the rotated queries and keys, the attention's output and projection
  input, the MLP's (Qwen2-VL: fc1, QuickGELU's input, sigmoid and product: 3 x MLP; Qwen2.5-VL: the
  gated MLP's gate, up, activation and product: 4 x MLP); and the merger's `MERGER_WIDTHS` x hidden
  (its norm, GELU's input and output). With activation checkpointing: each layer's input, the
  pixel values and the merger's (read off the same way); the layer the backward recomputes runs
  after the decoder's backward has freed the decoder's activations, so it is not at the peak;
- beside the update, the processor's pixel values the step's rollouts hold: one image per prompt of
  the step (a group's rows share their prompt's tensor).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from mmrl.errors import UserError

from ..model_loading import DTYPES, load_tiny, pretrained, weightless
from .memory_formula import DecoderMemory, config_field, planned_settings

# elements per patch and vision layer: (x hidden, x MLP width, constant), by the tower's model type
LAYER_WIDTHS = {"qwen2_vl_vision": (11, 3, 6), "qwen2_5_vl_vision": (13, 4, 4)}
MERGER_WIDTHS = {"qwen2_vl_vision": 5, "qwen2_5_vl_vision": 6}  # elements per patch x hidden, the merger's
EMBEDDING_EXTRA = 2  # elements per patch beside the pixel values, outside the layers


class VisionLanguageMemory(DecoderMemory):
    """A Qwen2-VL-style model's memory: `image_tokens` merged tokens per prompt from `patches` patches
    of `patch_width` pixel values each, through the vision tower (`vision` its configuration)."""

    family = "vision-language model (decoder with a vision encoder)"

    def __init__(self, module: nn.Module, cfg: Any, prompt_length: int, max_pixels: int):
        vision = module.config.vision_config
        kind = vision.model_type
        if kind not in LAYER_WIDTHS:
            raise UserError(f"mmrl plan: the vision encoder {kind!r} of {cfg.model} has no memory formula "
                            f"(modelled: {', '.join(LAYER_WIDTHS)}); its memory is not planned")
        merge = config_field(vision, "spatial_merge_size")
        side = config_field(vision, "patch_size") * merge
        self.image_tokens = max_pixels // side ** 2
        if self.image_tokens < 1:
            raise UserError(f"mmrl plan: policy.max_pixels={max_pixels} is below one merged patch ({side} x {side})")
        super().__init__(module, cfg.gradient_checkpointing, prompt_length + self.image_tokens, cfg.max_new_tokens,
                         cfg.logprob_chunk_tokens, cfg.logprob_chunk_rows, cfg.logprob_check)
        self.patches = self.image_tokens * merge ** 2
        self.patch_width = module.model.visual.patch_embed.proj.weight[0].numel()
        self.vision_hidden = getattr(vision, "embed_dim", None) or config_field(vision, "hidden_size")
        mlp = getattr(vision, "intermediate_size", None)
        self.vision_mlp = mlp if isinstance(mlp, int) else int(self.vision_hidden * vision.mlp_ratio)
        self.vision_layers = config_field(vision, "depth")
        self.widths, self.merger = LAYER_WIDTHS[kind], MERGER_WIDTHS[kind]

    def vision_layer_elements(self) -> int:
        """One patch's activations in one vision layer."""
        per_hidden, per_mlp, constant = self.widths
        return per_hidden * self.vision_hidden + per_mlp * self.vision_mlp + constant

    def vision_bytes(self, rows: int, checkpointing: bool) -> int:
        """The vision tower's activations for `rows` rows' images."""
        kept = self.vision_hidden if checkpointing else self.vision_layer_elements()
        outside = self.patch_width + EMBEDDING_EXTRA + self.merger * self.vision_hidden
        return rows * self.patches * (self.vision_layers * kept + outside) * self.bytes

    def activation_bytes(self, rows: int, checkpointing: bool) -> int:
        return super().activation_bytes(rows, checkpointing) + self.vision_bytes(rows, checkpointing)

    def update_bytes(self, rows: int, prompts: int, trains_head: bool) -> dict[str, int]:
        return {**super().update_bytes(rows, prompts, trains_head), "rollouts' pixel values": self.pixel_bytes(prompts)}

    def first_step_bytes(self, rows: int, prompts: int) -> dict[str, int]:
        passes = super().first_step_bytes(rows, prompts)
        return {**passes, "rollouts' pixel values": self.pixel_bytes(prompts)} if passes else passes

    def pixel_bytes(self, prompts: int) -> int:
        """The processor's pixel values the step's rollouts hold beside a pass: one image per prompt
        (a group's rows share their prompt's tensor)."""
        return prompts * self.patches * self.patch_width * self.bytes


def vision_language_memory(cfg: Any, prompt_length: int) -> VisionLanguageMemory:
    """The formula over the weightless build of `cfg`'s model and its processor's image bound (the
    recipe's `max_pixels` first); settings it does not model are refused by name."""
    planned_settings(cfg)
    with weightless():
        if cfg.model.startswith("tiny:"):
            module, processor = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)
            image_processor = processor.image_processor
        else:
            from transformers import AutoImageProcessor, AutoModelForImageTextToText
            module = pretrained(AutoModelForImageTextToText, cfg.model, dtype=DTYPES[cfg.dtype],
                                trust_remote_code=cfg.trust_remote_code)
            bounds = {k: v for k, v in (("min_pixels", cfg.min_pixels), ("max_pixels", cfg.max_pixels)) if v}
            image_processor = AutoImageProcessor.from_pretrained(cfg.tokenizer or cfg.model,  # as the policy loads it
                                                                 trust_remote_code=cfg.trust_remote_code, **bounds)
    vision = getattr(module.config, "vision_config", None)
    if vision is None or not hasattr(getattr(module, "model", None), "visual"):
        raise UserError(f"mmrl plan: {cfg.model} ({type(module).__name__}) is not a Qwen2-VL-style model (a vision "
                        "tower `visual`); its memory is not planned")
    size = getattr(image_processor, "size", None) or {}
    max_pixels = getattr(image_processor, "max_pixels", None) or size.get("longest_edge")
    if not isinstance(max_pixels, int):
        raise UserError(f"mmrl plan: {cfg.model}'s image processor gives no max_pixels; set policy.max_pixels")
    return VisionLanguageMemory(module, cfg, prompt_length, max_pixels)
