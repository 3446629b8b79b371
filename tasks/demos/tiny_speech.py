"""Tiny random speakers built from configs, registered in `tasks.model_loading.TINY_MODELS`: a CSM
(backbone, depth decoder and Mimi codec) over the character tokenizer as ``tiny:csm-char``, and a
Dia (text-byte encoder, delayed-codebook decoder) with a DAC codec in its in-memory processor as
``tiny:dia``."""

from __future__ import annotations

import torch
from transformers import (CsmConfig, CsmDepthDecoderConfig, CsmForConditionalGeneration, DacConfig, DacModel,
                          DiaConfig, DiaFeatureExtractor, DiaForConditionalGeneration, DiaProcessor, DiaTokenizer,
                          MimiConfig)

from ..model_loading import TINY_MODELS
from .tiny_models import char_tokenizer, seeded_model


def tiny_mimi(codebooks: int, codebook_size: int) -> MimiConfig:
    """A Mimi codec of a hundred thousand weights at Mimi's own rates (24 kHz, 12.5 frames a second)."""
    return MimiConfig(hidden_size=64, num_filters=2, upsample_groups=64, num_residual_layers=1,
                      upsampling_ratios=[8, 6, 5, 4], codebook_size=codebook_size, codebook_dim=32,
                      vector_quantization_hidden_dimension=32, num_quantizers=codebooks, num_semantic_quantizers=1,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
                      head_dim=16, sliding_window=64)


@TINY_MODELS.register("csm-char")
def csm_char(hidden: int = 64, layers: int = 2, heads: int = 4, codebooks: int = 4, codebook_size: int = 64,
             seed: int = 0):
    """CSM with `codebooks` codebooks of `codebook_size` codes (+3 marker ids, as CSM's 2048 + 3) and
    the character tokenizer with a ``<bos>`` token; returns (model, tokenizer)."""
    tokenizer = char_tokenizer(bos_token="<bos>")
    vocab = len(tokenizer)
    depth = CsmDepthDecoderConfig(num_codebooks=codebooks, backbone_hidden_size=hidden, vocab_size=codebook_size + 3,
                                  hidden_size=hidden // 2, intermediate_size=hidden, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=codebooks + 1)
    config = CsmConfig(num_codebooks=codebooks, vocab_size=codebook_size + 3, text_vocab_size=vocab + 2,
                       hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=512,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, audio_token_id=vocab, audio_eos_token_id=vocab + 1,
                       codebook_pad_token_id=codebook_size + 2, codebook_eos_token_id=0,
                       depth_decoder_config=depth, codec_config=tiny_mimi(codebooks, codebook_size))
    model = seeded_model(CsmForConditionalGeneration, config, tokenizer, seed)
    generator = torch.Generator().manual_seed(seed)
    for layer in model.codec_model.quantizer.modules():  # Mimi's codebooks start at zero (all codes alike)
        if hasattr(layer, "embed_sum"):
            layer.embed_sum.copy_(torch.randn(layer.embed_sum.shape, generator=generator))
            layer._embed = None
    return model, tokenizer


@TINY_MODELS.register("dia")
def dia(hidden: int = 32, layers: int = 1, codebook_size: int = 64, delay_pattern: tuple[int, ...] = (0, 2, 3),
        seed: int = 0):
    """Dia with ``len(delay_pattern)`` codebooks of `codebook_size` codes (+ eos, pad, bos and one spare id,
    as Dia's 1024 + 4) delayed by `delay_pattern` (Dia's: 0, 8, 9, ..., 15), and a `DiaProcessor` of the
    stock byte tokenizer, feature extractor and a tiny random DAC at 44.1 kHz, 512 samples a frame (Dia's
    codec's rates); returns (model, processor)."""
    channels = len(delay_pattern)
    eos, pad, bos = codebook_size, codebook_size + 1, codebook_size + 2
    encoder = {"hidden_size": hidden, "intermediate_size": hidden * 2, "num_hidden_layers": layers,
               "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": hidden // 2, "vocab_size": 256}
    decoder = {"hidden_size": hidden, "intermediate_size": hidden * 2, "num_hidden_layers": layers,
               "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": hidden // 2,
               "cross_num_attention_heads": 2, "cross_head_dim": hidden // 2, "cross_num_key_value_heads": 2,
               "cross_hidden_size": hidden, "vocab_size": codebook_size + 4, "num_channels": channels,
               "max_position_embeddings": 512, "pad_token_id": pad, "eos_token_id": eos, "bos_token_id": bos}
    config = DiaConfig(encoder_config=encoder, decoder_config=decoder, delay_pattern=list(delay_pattern))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DiaForConditionalGeneration(config).eval()
        codec = DacModel(DacConfig(encoder_hidden_size=4, downsampling_ratios=[2, 4, 8, 8], decoder_hidden_size=16,
                                   n_codebooks=channels, codebook_size=codebook_size, codebook_dim=4,
                                   sampling_rate=44100)).eval()
    model.generation_config.update(pad_token_id=pad, eos_token_id=eos, bos_token_id=bos, decoder_start_token_id=bos)
    processor = DiaProcessor(DiaFeatureExtractor(sampling_rate=44100, hop_length=512), DiaTokenizer(), codec)
    return model, processor
