"""Tiny random multimodal models over the character tokenizer, each with its processor, for tests
and CPU demos (no download): Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, LLaVA, Qwen2-Audio and the
thinker of Qwen2.5-Omni, registered as ``tiny:NAME`` in `tasks.model_loading.TINY_MODELS`."""

from __future__ import annotations

import torch

from ..model_loading import TINY_MODELS
from .tiny_models import char_tokenizer, char_tokenizer_with, chat_template, mrope_section, seeded_model, text_config

QWEN_VL_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                    "<|video_pad|>"]
QWEN_VL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@TINY_MODELS.register("qwen2.5-vl-char")
def qwen25_vl_char(hidden: int = 64, layers: int = 2, heads: int = 4, vision_hidden: int = 32,
                   rope_theta: float = 10.0, max_pixels: int = 112 * 112, min_pixels: int = 28 * 28, seed: int = 0):
    """A Qwen2.5-VL (1-layer vision tower, `layers`-layer text model over characters) with its
    processor: Qwen's image processor (images resized to between `min_pixels` and `max_pixels`)
    and a chat template with the vision tokens. A small `rope_theta` lets a tiny model tell its
    few visual tokens apart."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor
    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_VL_SPECIALS})
    tokenizer.chat_template = QWEN_VL_TEMPLATE
    image_processor = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14, merge_size=2)
    processor = Qwen2_5_VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                    video_processor=Qwen2VLVideoProcessor(), chat_template=QWEN_VL_TEMPLATE)
    ids = tokenizer.convert_tokens_to_ids
    section = mrope_section(hidden // heads)
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         rope_scaling={"type": "mrope", "mrope_section": section}, rope_theta=rope_theta,
                         max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id),
        vision_config=dict(depth=1, hidden_size=vision_hidden, intermediate_size=vision_hidden * 2, num_heads=2,
                           out_hidden_size=hidden, fullatt_block_indexes=[0], window_size=56),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id)
    return seeded_model(Qwen2_5_VLForConditionalGeneration, config, tokenizer, seed), processor


QWEN_AUDIO_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>"]
QWEN_AUDIO_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@TINY_MODELS.register("qwen2-audio-char")
def qwen2_audio_char(hidden: int = 64, layers: int = 2, heads: int = 4, audio_hidden: int = 32,
                     max_seconds: int = 30, seed: int = 0):
    """A Qwen2-Audio (1-layer Whisper-style encoder, `layers`-layer text model over characters)
    with its processor: Whisper's 128-mel feature extractor and a chat template with audio slots.
    Clips are padded to `max_seconds` (Whisper's 30 by default); the encoder runs over all of it,
    so short clips train several times faster with a small window."""
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor, WhisperFeatureExtractor
    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_AUDIO_SPECIALS})
    tokenizer.chat_template = QWEN_AUDIO_TEMPLATE
    processor = Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128, chunk_length=max_seconds),
                                    tokenizer=tokenizer,
                                    chat_template=QWEN_AUDIO_TEMPLATE)
    config = Qwen2AudioConfig(
        audio_config=dict(d_model=audio_hidden, encoder_layers=1, encoder_attention_heads=2,
                          encoder_ffn_dim=audio_hidden * 2, num_mel_bins=128, max_source_positions=50 * max_seconds),
        text_config=dict(model_type="qwen2", vocab_size=len(tokenizer), hidden_size=hidden,
                         intermediate_size=hidden * 2, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2), pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id),
        audio_token_index=tokenizer.convert_tokens_to_ids("<|AUDIO|>"))
    return seeded_model(Qwen2AudioForConditionalGeneration, config, tokenizer, seed), processor


@TINY_MODELS.register("qwen2-vl-char")
def qwen2_vl_char(hidden: int = 64, layers: int = 2, heads: int = 4, vision_hidden: int = 32,
                  rope_theta: float = 10.0, max_pixels: int = 112 * 112, seed: int = 0):
    """A Qwen2-VL (1-layer vision tower) over characters, with Qwen's image and video processors."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor
    tokenizer = char_tokenizer_with(QWEN_VL_SPECIALS, QWEN_VL_TEMPLATE)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=max_pixels),
                                 tokenizer=tokenizer, video_processor=Qwen2VLVideoProcessor(),
                                 chat_template=QWEN_VL_TEMPLATE)
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2VLConfig(
        text_config=text_config(tokenizer, hidden, layers, heads, rope_theta=rope_theta,
                                rope_scaling={"type": "mrope", "mrope_section": mrope_section(hidden // heads)}),
        vision_config=dict(depth=1, embed_dim=vision_hidden, hidden_size=hidden, mlp_ratio=2, num_heads=2),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id)
    return seeded_model(Qwen2VLForConditionalGeneration, config, tokenizer, seed), processor


@TINY_MODELS.register("qwen3-vl-char")
def qwen3_vl_char(hidden: int = 64, layers: int = 2, heads: int = 4, vision_hidden: int = 32,
                  rope_theta: float = 10.0, max_pixels: int = 128 * 128, seed: int = 0):
    """A Qwen3-VL (1-layer vision tower with one deepstack layer, patches of 16) over characters,
    with its image and video processors (timestamps written into the video's text)."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor, Qwen3VLVideoProcessor
    tokenizer = char_tokenizer_with(QWEN_VL_SPECIALS, QWEN_VL_TEMPLATE)
    image_processor = Qwen2VLImageProcessor(patch_size=16, merge_size=2, min_pixels=32 * 32, max_pixels=max_pixels)
    video_processor = Qwen3VLVideoProcessor(patch_size=16, merge_size=2,
                                            size={"shortest_edge": 32 * 32, "longest_edge": 64 * 64 * 8})
    processor = Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                 video_processor=video_processor, chat_template=QWEN_VL_TEMPLATE)
    ids = tokenizer.convert_tokens_to_ids
    head_dim = hidden // heads
    config = Qwen3VLConfig(
        text_config=text_config(tokenizer, hidden, layers, heads, head_dim=head_dim,
                                rope_parameters={"rope_type": "default", "rope_theta": rope_theta,
                                                 "mrope_section": mrope_section(head_dim), "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=vision_hidden, intermediate_size=vision_hidden * 2, num_heads=2,
                           out_hidden_size=hidden, num_position_embeddings=64, deepstack_visual_indexes=[0]),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True)
    return seeded_model(Qwen3VLForConditionalGeneration, config, tokenizer, seed), processor


GEMMA3_SPECIALS = ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"]


@TINY_MODELS.register("gemma3-char")
def gemma3_char(hidden: int = 64, layers: int = 2, heads: int = 4, vision_hidden: int = 32, image_size: int = 56,
                tokens_per_image: int = 4, seed: int = 0):
    """A Gemma 3 (1-layer SigLIP tower on `image_size` squares, `tokens_per_image` soft tokens per
    image; a sliding-window and a global text layer) over characters, with Gemma's image processor."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor
    template = chat_template(image="<start_of_image>", turn=("<start_of_turn>", "<end_of_turn>"), assistant="model")
    tokenizer = char_tokenizer_with(GEMMA3_SPECIALS, template, boi_token="<start_of_image>",
                                    eoi_token="<end_of_image>", image_token="<image_soft_token>")
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessor(size={"height": image_size, "width": image_size}),
                                tokenizer=tokenizer, chat_template=template, image_seq_length=tokens_per_image)
    ids = tokenizer.convert_tokens_to_ids
    config = Gemma3Config(
        text_config=text_config(tokenizer, hidden, layers, heads, head_dim=hidden // heads, sliding_window=8,
                                layer_types=[("sliding_attention", "full_attention")[i % 2] for i in range(layers)]),
        vision_config=dict(hidden_size=vision_hidden, intermediate_size=vision_hidden * 2, num_hidden_layers=1,
                           num_attention_heads=2, image_size=image_size, patch_size=14),
        mm_tokens_per_image=tokens_per_image, boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"), image_token_index=ids("<image_soft_token>"), tie_word_embeddings=True)
    model = seeded_model(Gemma3ForConditionalGeneration, config, tokenizer, seed)
    # transformers initialises the projector to zeros, which blocks every gradient to the vision
    # tower until a step has moved it; a trained checkpoint's projector is not zero
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.02)
    return model, processor


@TINY_MODELS.register("llava-char")
def llava_char(hidden: int = 64, layers: int = 2, heads: int = 4, vision_hidden: int = 32, image_size: int = 56,
               seed: int = 0):
    """A LLaVA (1-layer CLIP tower on `image_size` squares, a Llama text model) over characters, with
    CLIP's image processor; each image is (image_size / 14)^2 `<image>` tokens."""
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    template = chat_template(image="<image>")
    tokenizer = char_tokenizer_with(["<|im_start|>", "<|im_end|>", "<image>"], template, image_token="<image>")
    image_processor = CLIPImageProcessor(size={"shortest_edge": image_size},
                                         crop_size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=template)
    config = LlavaConfig(
        text_config=dict(model_type="llama", **text_config(tokenizer, hidden, layers, heads)),
        vision_config=dict(model_type="clip_vision_model", hidden_size=vision_hidden, intermediate_size=vision_hidden * 2,
                           num_hidden_layers=1, num_attention_heads=2, image_size=image_size, patch_size=14,
                           projection_dim=vision_hidden),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1, tie_word_embeddings=True)
    return seeded_model(LlavaForConditionalGeneration, config, tokenizer, seed), processor


OMNI_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>", "<|vision_bos|>",
                 "<|vision_eos|>", "<|IMAGE|>", "<|VIDEO|>"]


@TINY_MODELS.register("qwen2.5-omni-thinker-char")
def qwen25_omni_thinker_char(hidden: int = 64, layers: int = 2, heads: int = 4, encoder_hidden: int = 32,
                             rope_theta: float = 10.0, max_seconds: int = 30, seed: int = 0):
    """The thinker of a Qwen2.5-Omni (1-layer audio and vision encoders, `layers`-layer text model
    over characters; the part that reads audio and writes text) with Omni's processor."""
    from transformers import (
        Qwen2_5OmniProcessor,
        Qwen2_5OmniThinkerConfig,
        Qwen2_5OmniThinkerForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        WhisperFeatureExtractor,
    )
    template = chat_template(image="<|vision_bos|><|IMAGE|><|vision_eos|>", video="<|vision_bos|><|VIDEO|><|vision_eos|>",
                             audio="<|audio_bos|><|AUDIO|><|audio_eos|>")
    tokenizer = char_tokenizer_with(OMNI_SPECIALS, template, image_token="<|IMAGE|>", audio_token="<|AUDIO|>",
                                    video_token="<|VIDEO|>", vision_bos_token="<|vision_bos|>",
                                    vision_eos_token="<|vision_eos|>", audio_bos_token="<|audio_bos|>",
                                    audio_eos_token="<|audio_eos|>")
    processor = Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=112 * 112),
        video_processor=Qwen2VLVideoProcessor(), tokenizer=tokenizer, chat_template=template,
        feature_extractor=WhisperFeatureExtractor(feature_size=128, chunk_length=max_seconds))
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5OmniThinkerConfig(
        audio_config=dict(d_model=encoder_hidden, encoder_layers=1, encoder_attention_heads=2,
                          encoder_ffn_dim=encoder_hidden * 2, num_mel_bins=128, max_source_positions=50 * max_seconds,
                          output_dim=hidden),
        vision_config=dict(depth=1, hidden_size=encoder_hidden, intermediate_size=encoder_hidden * 2, num_heads=2,
                           out_hidden_size=hidden, fullatt_block_indexes=[0], window_size=56),
        text_config=text_config(tokenizer, hidden, layers, heads,
                                rope_parameters={"rope_type": "default", "rope_theta": rope_theta,
                                                 "mrope_section": mrope_section(hidden // heads)}),
        audio_token_index=ids("<|AUDIO|>"), image_token_index=ids("<|IMAGE|>"), video_token_index=ids("<|VIDEO|>"),
        audio_start_token_id=ids("<|audio_bos|>"), audio_end_token_id=ids("<|audio_eos|>"),
        vision_start_token_id=ids("<|vision_bos|>"), vision_end_token_id=ids("<|vision_eos|>"),
        user_token_id=ids("u"), tie_word_embeddings=True)
    return seeded_model(Qwen2_5OmniThinkerForConditionalGeneration, config, tokenizer, seed), processor
