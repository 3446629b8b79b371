"""A tiny random Janus(-Pro) model (`JanusForConditionalGeneration`: a Llama decoder, a SigLIP
vision encoder, a VQ image tokenizer with its generation head) over the character tokenizer, for
the autoregressive image generation tests and CPU runs (`policy.model: tiny:janus`)."""

from __future__ import annotations

from transformers import JanusConfig, JanusForConditionalGeneration

from ..model_loading import TINY_MODELS
from .tiny_models import char_tokenizer, seeded_model


@TINY_MODELS.register("janus")
def tiny_janus(hidden: int = 64, layers: int = 2, heads: int = 4, codebook: int = 64, patches: int = 4,
               seed: int = 0):
    """Janus with a `hidden`-wide, `layers`-deep text decoder and a VQ codebook of `codebook` image
    tokens; an image is `patches` x `patches` tokens, decoded to 4 `patches` pixels a side (the VQ
    decoder upsamples twice). The tokenizer's `boi_token` starts an image, as Janus-Pro's does."""
    tokenizer = char_tokenizer(image_token="<image_placeholder>", boi_token="<begin_of_image>",
                               eoi_token="<end_of_image>")
    text = {"model_type": "llama", "vocab_size": len(tokenizer), "hidden_size": hidden,
            "intermediate_size": hidden * 2, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": heads, "max_position_embeddings": 256,
            "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.eos_token_id,
            "eos_token_id": tokenizer.eos_token_id}
    vision = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 8 * patches,
              "patch_size": 8, "projection_dim": hidden, "num_image_tokens": patches * patches,
              "mlp_ratio": 2.0}
    vq = {"embed_dim": 8, "num_embeddings": codebook, "latent_channels": 32, "base_channels": 32,
          "channel_multiplier": [1, 1, 2], "num_res_blocks": 1, "projection_dim": hidden,
          "image_token_embed_dim": hidden, "num_hidden_layers": 2}
    config = JanusConfig(text_config=text, vision_config=vision, vq_config=vq,
                         image_token_id=tokenizer.convert_tokens_to_ids("<image_placeholder>"))
    model = seeded_model(JanusForConditionalGeneration, config, tokenizer, seed)
    model.generation_config.generation_kwargs = {"boi_token_id": tokenizer.convert_tokens_to_ids("<begin_of_image>")}
    return model.eval(), tokenizer
