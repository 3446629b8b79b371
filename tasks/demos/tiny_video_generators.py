"""Tiny random video pipelines of 2026's generators, assembled in memory from configs (tests, CPU
recipes; no download): Wan 2.2 A14B's text-to-video pipeline with its two experts, HunyuanVideo 1.5's
text-to-video pipeline."""

from __future__ import annotations

import torch

from ..model_loading import TINY_MODELS
from .tiny_multimodal import qwen25_vl_char
from .tiny_pipelines import _umt5, _wan_transformer, _wan_vae, pipeline_tokenizer

# Wan 2.2 T2V-A14B's switch: the high-noise expert denoises timesteps >= 0.875 * 1000 (its
# model_index.json; the I2V-A14B checkpoint's is 0.9)
WAN22_A14B_BOUNDARY = 0.875


@TINY_MODELS.register("wan22-a14b")
def tiny_wan22_a14b(seed: int = 0, layers: int = 1, boundary_ratio: float = WAN22_A14B_BOUNDARY):
    """A WanPipeline as Wan 2.2 T2V-A14B is one: a UMT5 encoder, two `layers`-layer Wan video
    transformers of the same shape drawn apart (`transformer`, the high-noise expert, and
    `transformer_2`, the low-noise one) switched at `boundary_ratio` * 1000, the Wan VAE (4x time,
    4x space), the flow-matching Euler scheduler with Wan's shift 3 (3 steps: one high-noise step,
    two low-noise ones)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = pipeline_tokenizer()
        return WanPipeline(tokenizer=tok, text_encoder=_umt5(tok), vae=_wan_vae(),
                           transformer=_wan_transformer(4, layers), transformer_2=_wan_transformer(4, layers),
                           scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), boundary_ratio=boundary_ratio)


@TINY_MODELS.register("hunyuan-video-15")
def tiny_hunyuan_video15(seed: int = 0, layers: int = 1, guidance_scale: float = 6.0):
    """A HunyuanVideo15Pipeline (text to video): a 3-layer Qwen2.5-VL text model over characters with
    its chat template (the pipeline reads its third-to-last hidden states past the system prompt's
    108 tokens), a 1-layer T5 over ByT5's bytes for quoted glyph text, a `layers`-layer HunyuanVideo
    1.5 transformer (latents, zero condition latents and mask in, 4 + 4 + 1 channels), its VAE (4x
    time, 4x space), the Euler flow scheduler, and classifier-free guidance at `guidance_scale`
    (the stock pipeline's scale sits in its guider: 6.0 as HunyuanVideo 1.5's)."""
    from diffusers import (AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler,
                           HunyuanVideo15Pipeline, HunyuanVideo15Transformer3DModel)
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder, processor = qwen25_vl_char(hidden=32, layers=3, heads=2, vision_hidden=16, seed=seed)
        byt5 = ByT5Tokenizer()
        glyph_encoder = T5EncoderModel(T5Config(vocab_size=len(byt5), d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                                num_heads=2, pad_token_id=byt5.pad_token_id)).eval()
        transformer = HunyuanVideo15Transformer3DModel(in_channels=9, out_channels=4, num_attention_heads=2,
                                                       attention_head_dim=8, num_layers=layers, num_refiner_layers=1,
                                                       text_embed_dim=32, text_embed_2_dim=16, image_embed_dim=16,
                                                       rope_axes_dim=(2, 2, 4), task_type="t2v")
        vae = AutoencoderKLHunyuanVideo15(latent_channels=4, block_out_channels=(8, 8, 8), layers_per_block=1,
                                          spatial_compression_ratio=4, temporal_compression_ratio=4).eval()
        return HunyuanVideo15Pipeline(text_encoder=text_encoder, tokenizer=processor.tokenizer, transformer=transformer,
                                      vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
                                      text_encoder_2=glyph_encoder, tokenizer_2=byt5,
                                      guider=ClassifierFreeGuidance(guidance_scale=guidance_scale))
