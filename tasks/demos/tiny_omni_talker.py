"""A tiny random Qwen2.5-Omni (thinker, talker and token2wav built from configs, a speaker's conditioning drawn at
random) over the character tokenizer with Qwen's chat markers, registered as ``tiny:qwen2_5-omni-talker`` in
`tasks.model_loading.TINY_MODELS`."""

from __future__ import annotations

import torch
from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

from ..model_loading import TINY_MODELS
from .tiny_models import char_tokenizer_with, chat_template, seeded_model

# Qwen2.5-Omni's special tokens that the thinker and talker configs name, in the tokenizer as tokens of their own
OMNI_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|tts_bos|>", "<|tts_eos|>", "<|tts_pad|>", "<|AUDIO|>", "<|IMAGE|>",
                 "<|VIDEO|>", "<|audio_bos|>", "<|audio_eos|>", "<|vision_bos|>", "<|vision_eos|>", "<|spk_bos|>"]
MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
SPEAKER = "Chelsie"  # the stock generate's default speaker


def omni_config(tokenizer, hidden: int, layers: int, codebook_size: int, mel_dim: int) -> Qwen2_5OmniConfig:
    """Thinker (text, a one-layer audio and vision tower), talker over `codebook_size` codes and 5 marker ids (pad,
    start, end, a spare, mask at Qwen2.5-Omni's 8292..8296 offsets), token2wav (DiT over every talker id, BigVGAN)."""
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in OMNI_SPECIALS}
    media = dict(audio_token_index=ids["<|AUDIO|>"], image_token_index=ids["<|IMAGE|>"],
                 video_token_index=ids["<|VIDEO|>"], audio_start_token_id=ids["<|audio_bos|>"],
                 audio_end_token_id=ids["<|audio_eos|>"], vision_start_token_id=ids["<|vision_bos|>"],
                 vision_end_token_id=ids["<|vision_eos|>"])
    decoder = dict(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=1024, rope_parameters=MROPE)
    thinker = dict(text_config=dict(vocab_size=len(tokenizer), **decoder),
                   audio_config=dict(num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
                                     d_model=16, output_dim=hidden, n_window=4, max_source_positions=32),
                   vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=hidden,
                                      fullatt_block_indexes=[0], window_size=28),
                   user_token_id=ids["<|im_start|>"], **media)
    vocab = codebook_size + 5
    talker = dict(vocab_size=vocab, tts_codec_pad_token_id=codebook_size, tts_codec_start_token_id=codebook_size + 1,
                  tts_codec_end_token_id=codebook_size + 2, tts_codec_mask_token_id=codebook_size + 4,
                  tts_text_start_token_id=ids["<|tts_bos|>"], tts_text_end_token_id=ids["<|tts_eos|>"],
                  tts_text_pad_token_id=ids["<|tts_pad|>"], embedding_size=hidden, head_dim=hidden // 4, **decoder,
                  **media)
    token2wav = dict(dit_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, head_dim=16, emb_dim=16,
                                     num_embeds=vocab, mel_dim=mel_dim, enc_emb_dim=8, enc_dim=8, block_size=4,
                                     enc_channels=[16, 16, 16, 16, 48], enc_attention_channels=8, enc_se_channels=8,
                                     look_ahead_layers=[1], look_backward_layers=[0], max_position_embeddings=2048),
                     bigvgan_config=dict(mel_dim=mel_dim, upsample_initial_channel=16, resblock_kernel_sizes=[3],
                                         resblock_dilation_sizes=[[1, 3, 5]], upsample_rates=[5, 4, 4],
                                         upsample_kernel_sizes=[10, 8, 8]))
    return Qwen2_5OmniConfig(thinker_config=thinker, talker_config=talker, token2wav_config=token2wav)


@TINY_MODELS.register("qwen2_5-omni-talker")
def qwen2_5_omni_talker(hidden: int = 32, layers: int = 2, codebook_size: int = 32, seed: int = 0):
    """Qwen2.5-Omni of a hundred thousand weights (`omni_config`) with one speaker, ``Chelsie`` (its text bos token,
    speaker vector and reference mel drawn from `seed`, as `load_speakers` reads them from spk_dict.pt), the
    thinker's replies ending at ``<|im_end|>``; returns (model, tokenizer)."""
    tokenizer = char_tokenizer_with(OMNI_SPECIALS, chat_template())
    tokenizer.eos_token = "<|im_end|>"
    mel_dim = 8
    model = seeded_model(Qwen2_5OmniForConditionalGeneration, omni_config(tokenizer, hidden, layers, codebook_size,
                                                                           mel_dim), tokenizer, seed)
    model.thinker.generation_config.eos_token_id = tokenizer.eos_token_id
    generator = torch.Generator().manual_seed(seed)
    model.speaker_map = {SPEAKER: {"bos_token": tokenizer.convert_tokens_to_ids("<|spk_bos|>"),
                                   "cond": torch.randn(1, 8, generator=generator),
                                   "ref_mel": torch.randn(1, 20, mel_dim, generator=generator)}}
    return model, tokenizer
