"""Tiny random models with in-memory tokenizers, for tests and CPU demos (no download).

A recipe names one as ``policy.model: tiny:NAME``; everything else loads with
``from_pretrained(name_or_local_path)``.
"""

from __future__ import annotations

import string
from typing import Callable

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from mmrl.registry import Registry

TINY_MODELS: Registry[Callable[..., tuple]] = Registry("tiny model")

CHAR_SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHAR_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of digits, letters, punctuation, space and newline."""
    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIALS + list(CHAR_ALPHABET))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def seeded_model(model_class, config, tokenizer, seed: int):
    """`model_class(config)` initialised from `seed` (the global RNG is left as it was), with the
    tokenizer's pad / eos ids in its generation config."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.eos_token_id
    return model


def tiny_qwen2(tokenizer, hidden: int = 128, layers: int = 2, heads: int = 4, seed: int = 0,
               max_positions: int = 512) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 4,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 2), max_position_embeddings=max_positions,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    return seeded_model(Qwen2ForCausalLM, config, tokenizer, seed)


@TINY_MODELS.register("qwen2-char")
def qwen2_char(hidden: int = 128, layers: int = 2, heads: int = 4, seed: int = 0):
    """A Qwen2 decoder over the character tokenizer (the text demo's policy)."""
    tokenizer = char_tokenizer()
    return tiny_qwen2(tokenizer, hidden, layers, heads, seed), tokenizer


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
                   rope_theta: float = 10.0, max_pixels: int = 112 * 112, seed: int = 0):
    """A Qwen2.5-VL (1-layer vision tower, `layers`-layer text model over characters) with its
    processor: Qwen's image processor and a chat template with the vision tokens. A small
    `rope_theta` lets a tiny model tell its few visual tokens apart."""
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor,
                              Qwen2VLImageProcessor, Qwen2VLVideoProcessor)
    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_VL_SPECIALS})
    tokenizer.chat_template = QWEN_VL_TEMPLATE
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=max_pixels, patch_size=14, merge_size=2)
    processor = Qwen2_5_VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                    video_processor=Qwen2VLVideoProcessor(), chat_template=QWEN_VL_TEMPLATE)
    ids = tokenizer.convert_tokens_to_ids
    half = hidden // heads // 2  # rotary frequencies per head, split over (time, height, width)
    section = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
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
    from transformers import (Qwen2AudioConfig, Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor,
                              WhisperFeatureExtractor)
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
