"""A tiny random Emu3 model (`Emu3ForConditionalGeneration`: a Llama-like decoder over one vocabulary
of text and visual tokens, and the `Emu3VQVAE` image tokenizer) with an in-memory `Emu3Processor`
over the character tokenizer, for the autoregressive image generation tests and CPU runs
(`policy.model: tiny:emu3`)."""

from __future__ import annotations

from transformers import Emu3Config, Emu3ForConditionalGeneration, Emu3ImageProcessor, Emu3Processor

from ..model_loading import TINY_MODELS
from .tiny_models import char_tokenizer, seeded_model

# Emu3's special tokens, as its tokenizer names them: the row end of an image is <|extra_200|>, the
# frame end <|extra_201|>; a codebook entry i is the text token <|visual token iiiiii|>
EMU3_SPECIALS = {"image_token": "<image>", "boi_token": "<|image start|>", "eoi_token": "<|image end|>",
                 "image_wrapper_token": "<|image token|>", "eof_token": "<|extra_201|>", "bos_token": "<|bos|>"}
ROW_END = "<|extra_200|>"


@TINY_MODELS.register("emu3")
def tiny_emu3(hidden: int = 64, layers: int = 2, heads: int = 4, codebook: int = 32, seed: int = 0):
    """Emu3 with a `hidden`-wide, `layers`-deep decoder and a VQ codebook of `codebook` visual tokens
    (added to the character tokenizer as Emu3's tokenizer holds them); the VQ decoder upsamples an
    image's tokens 4 times a side, and the processor asks for as many tokens a side as Emu3's does
    (its `image_area` over 8 pixels a token: image_area 1024 is 4 x 4 tokens, 16 x 16 pixels)."""
    tokenizer = char_tokenizer(**EMU3_SPECIALS)
    tokenizer.add_tokens([ROW_END] + [f"<|visual token {i:06d}|>" for i in range(codebook)], special_tokens=True)
    text = {"vocab_size": len(tokenizer), "hidden_size": hidden, "intermediate_size": hidden * 2,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads,
            "max_position_embeddings": 256, "attention_dropout": 0.0, "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    vq = {"codebook_size": codebook, "embed_dim": 4, "latent_channels": 4, "base_channels": 32,
          "channel_multiplier": [1, 2, 2], "num_res_blocks": 1, "attn_resolutions": [2],
          "temporal_downsample_factor": 1, "hidden_size": 64}
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=tokenizer.get_vocab())
    model = seeded_model(Emu3ForConditionalGeneration, config, tokenizer, seed)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    processor = Emu3Processor(Emu3ImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3), tokenizer)
    return model.eval(), processor
