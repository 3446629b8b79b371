"""The memory formula of Janus text-to-image (the janus adapter's `memory_model`; docs/memory-plan.md):
the image's tokens are the completion, every row runs twice under classifier-free guidance (the
conditional and the unconditional prompt), and the VQ decoder makes the rollouts' images. From the
model's configuration alone (no weights):

- the training state: the language model, the generation embeddings, aligner and head train; the
  VQ model, the understanding encoder and its aligner are frozen as the policy freezes them (their
  weights counted, no gradients or AdamW state);
- the update (`guided_tokens.image_token_logprobs`): one forward of the language model over twice
  the rows, each the prompt and the image's tokens but the last (the causal LM's activations per
  token and layer, tasks/lm/memory_formula.py), the generation aligner's activations per image-token
  input (its first layer's input and 2 x projection width per layer after it) and the generation
  head's per scored token (2 x projection width); at the backward's peak, `HEAD_BUFFERS` fp32 blocks
  of [rows, image tokens, codebook] (the guided log-softmax saved by the forward, the gradients
  through the guidance and of both halves' logits: read off the allocation probe);
- a rollout: the key/value cache of twice the rows over the prompt and the image's tokens, the
  sampler's fp32 [2 x rows, codebook] buffers; or, where larger, the VQ decode of the rows' images
  (no gradients), per image the larger of `VQ_DECODE_BUFFERS` feature maps of the decoder's last
  stage (its base channels at the image's full resolution) and the decoded image's 3 channels, and
  the middle block's attention at the latent resolution (its [tokens, tokens] scores and softmax,
  `VQ_ATTENTION_MAPS` feature maps of its channels): read off the probe at 32 to 128 pixels.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import JanusForConditionalGeneration

from ..lm.memory_formula import SAMPLER_BUFFERS, DecoderMemory, config_field
from ..model_loading import DTYPES, load_tiny, pretrained, weightless

HEAD_BUFFERS = 5  # fp32 [rows, image tokens, codebook] blocks at the update's peak (module docstring)
VQ_DECODE_BUFFERS = 4  # last-stage feature maps per image at the VQ decode's peak
VQ_ATTENTION_MAPS = 6  # latent-resolution feature maps beside the middle block's attention scores


class JanusMemory(DecoderMemory):
    """Janus's memory: `module` the weightless build (its frozen parts marked), prompts of
    `prompt_length` tokens (the template and the begin-of-image token), the image's tokens drawn
    under guidance."""

    family = "autoregressive image generator (Janus: a decoder drawing VQ tokens under guidance)"

    def __init__(self, module: nn.Module, cfg: Any, prompt_length: int):
        vision, vq = module.config.vision_config, module.config.vq_config
        self.image_tokens = config_field(vision, "num_image_tokens")
        super().__init__(module, False, prompt_length, self.image_tokens, 0, 1, False)
        self.length = prompt_length + self.image_tokens - 1  # the training pass feeds every image token but the last
        self.prompt_length = prompt_length
        self.codebook = config_field(vq, "num_embeddings")
        self.projection = config_field(vq, "projection_dim")
        self.token_embedding = config_field(vq, "embed_dim")
        self.aligner_layers = config_field(vq, "num_hidden_layers")
        side = int(round(self.image_tokens ** 0.5)) * 2 ** (len(vq.channel_multiplier) - 1)
        self.image_pixels = side * side
        self.vq_channels = config_field(vq, "base_channels")
        self.vq_middle_channels = self.vq_channels * vq.channel_multiplier[-1]

    def activation_bytes(self, rows: int, checkpointing: bool) -> int:
        decoder = super().activation_bytes(2 * rows, checkpointing)
        aligner = (self.token_embedding + 2 * self.projection * self.aligner_layers) * (self.image_tokens - 1)
        head = 2 * self.projection * self.image_tokens
        return decoder + 2 * rows * (aligner + head) * self.bytes

    def update_bytes(self, rows: int, prompts: int, trains_head: bool) -> dict[str, int]:
        return {"activations": self.activation_bytes(rows, False),
                "guided log-softmax and its gradients": HEAD_BUFFERS * rows * self.image_tokens * self.codebook * 4}

    def first_step_bytes(self, rows: int, prompts: int) -> dict[str, int]:
        return {}

    def rollout_bytes(self, rows: int, group_size: int) -> dict[str, int]:
        cache = self.layers * 2 * self.kv_width * (self.prompt_length + self.image_tokens) * 2 * rows * self.bytes
        generation = {"KV cache (conditional and unconditional rows)": cache,
                      "sampler": SAMPLER_BUFFERS * 2 * rows * self.codebook * 4}
        last_stage = (VQ_DECODE_BUFFERS * self.vq_channels + 3) * self.image_pixels
        attention = 2 * self.image_tokens ** 2 + VQ_ATTENTION_MAPS * self.vq_middle_channels * self.image_tokens
        decode = rows * max(last_stage, attention) * self.bytes
        return generation if sum(generation.values()) >= decode else {"VQ decode of the images": decode}


def janus_memory(cfg: Any, prompt_length: int) -> JanusMemory:
    """The formula over the weightless build of `cfg`'s model, its frozen parts marked as the policy
    freezes them."""
    with weightless():
        if cfg.model.startswith("tiny:"):
            module = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)[0]
        else:
            module = pretrained(JanusForConditionalGeneration, cfg.model, dtype=DTYPES[cfg.dtype])
    for frozen in frozen_parts(module):
        frozen.requires_grad_(False)
    return JanusMemory(module, cfg, prompt_length)


def frozen_parts(module: nn.Module) -> tuple[nn.Module, ...]:
    """The parts of a Janus model that drawing does not train: the VQ model (as Janus trains it), the
    understanding encoder and its aligner (drawing does not use them)."""
    inner = module.model
    return inner.vqmodel, inner.vision_model, inner.aligner
