"""A tiny random DiffusionGemma (`DiffusionGemmaForBlockDiffusion`: a causal encoder and a block
diffusion decoder sharing their layers, mixture-of-experts MLPs, self-conditioning, a Gemma 4 vision
tower) over the character tokenizer, with Gemma 4's processor, registered as ``tiny:diffusion-gemma``
for tests and CPU demos (no download)."""

from __future__ import annotations

from ..model_loading import TINY_MODELS
from .tiny_models import char_tokenizer_with, seeded_model

DIFFUSION_GEMMA_SPECIALS = ["<boi>", "<eoi>", "<img>", "<boa>", "<eoa>", "<aud>"]
# each message as "<role initial>:content<eos>", an image as its placeholder; the generation prompt "a:"
DIFFUSION_GEMMA_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<img>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<eos>{% endfor %}{% if add_generation_prompt %}a:{% endif %}")


@TINY_MODELS.register("diffusion-gemma")
def diffusion_gemma_char(hidden: int = 32, layers: int = 2, heads: int = 2, experts: int = 4, canvas: int = 8,
                         vision_hidden: int = 16, seed: int = 0):
    """A DiffusionGemma with `layers` layers (sliding-window ones, the last global) of `experts`
    experts (2 per token), canvases of `canvas` tokens, and a 1-layer vision tower; its processor
    turns an image into at most 70 soft tokens (Gemma 4's smallest budget)."""
    from transformers import (
        DiffusionGemmaConfig,
        DiffusionGemmaForBlockDiffusion,
        Gemma4AudioFeatureExtractor,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
    )
    tokenizer = char_tokenizer_with(DIFFUSION_GEMMA_SPECIALS, DIFFUSION_GEMMA_TEMPLATE, boi_token="<boi>",
                                    eoi_token="<eoi>", image_token="<img>", boa_token="<boa>", eoa_token="<eoa>",
                                    audio_token="<aud>")
    processor = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(),
                                image_processor=Gemma4ImageProcessor(max_soft_tokens=70), tokenizer=tokenizer,
                                video_processor=Gemma4VideoProcessor(), chat_template=DIFFUSION_GEMMA_TEMPLATE,
                                image_seq_length=70)
    head = hidden // heads
    config = DiffusionGemmaConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=1, head_dim=head,
                         global_head_dim=head, sliding_window=1024, max_position_embeddings=4096,
                         layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"],
                         num_experts=experts, top_k_experts=2, moe_intermediate_size=hidden,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.eos_token_id),
        vision_config=dict(model_type="gemma4_vision", hidden_size=vision_hidden, intermediate_size=vision_hidden * 2,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                           head_dim=vision_hidden // 2),
        boi_token_id=tokenizer.convert_tokens_to_ids("<boi>"), eoi_token_id=tokenizer.convert_tokens_to_ids("<eoi>"),
        image_token_id=tokenizer.image_token_id, canvas_length=canvas)
    return seeded_model(DiffusionGemmaForBlockDiffusion, config, tokenizer, seed), processor
