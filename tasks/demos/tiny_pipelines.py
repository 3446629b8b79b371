"""Tiny random diffusers pipelines assembled in memory (tests, CPU recipes, the t2i demo; no download):
SD3, FLUX.1 and SD 1.5 with tiny CLIP / T5 text encoders over the character tokenizer, and the
demo's pixel-space flow pipeline."""

from __future__ import annotations

import torch
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

from ..model_loading import TINY_MODELS
from .tiny_models import char_tokenizer

MAX_PROMPT = 16


def _tokenizer():
    tok = char_tokenizer()
    tok.padding_side = "right"
    tok.model_max_length = MAX_PROMPT
    return tok


def _clip(tok, hidden=32, projection=True):
    config = CLIPTextConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                            num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=MAX_PROMPT,
                            projection_dim=hidden, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                            bos_token_id=tok.eos_token_id)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()


def _t5(tok, hidden=32):
    config = T5Config(vocab_size=len(tok), d_model=hidden, d_kv=8, d_ff=2 * hidden, num_layers=1, num_heads=2,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=0)
    return T5EncoderModel(config).eval()


def _vae(latent_channels, flux=False, sd15=False):
    from diffusers import AutoencoderKL
    return AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(8, 8), layers_per_block=1,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         latent_channels=latent_channels, norm_num_groups=4, sample_size=32,
                         scaling_factor=1.5, shift_factor=0.06 if flux else (None if sd15 else 0.0),
                         use_quant_conv=not flux, use_post_quant_conv=not flux).eval()


@TINY_MODELS.register("sd3")
def tiny_sd3(seed: int = 0, layers: int = 1):
    """A StableDiffusion3Pipeline: 2 CLIP + T5 encoders, a 1-layer MMDiT, a 2-level VAE (factor 2)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = _tokenizer()
        transformer = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, out_channels=4,
                                            num_layers=layers, attention_head_dim=8, num_attention_heads=2,
                                            joint_attention_dim=32, caption_projection_dim=16,
                                            pooled_projection_dim=64, pos_embed_max_size=32)
        return StableDiffusion3Pipeline(
            transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=_vae(4),
            text_encoder=_clip(tok), tokenizer=tok, text_encoder_2=_clip(tok), tokenizer_2=tok,
            text_encoder_3=_t5(tok), tokenizer_3=tok)


@TINY_MODELS.register("flux")
def tiny_flux(seed: int = 0, layers: int = 1, guidance_embeds: bool = True):
    """A FluxPipeline (packed latents, guidance embedding): CLIP + T5, one double and one single block."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = _tokenizer()
        transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=layers, num_single_layers=1,
                                             attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                                             pooled_projection_dim=32, guidance_embeds=guidance_embeds,
                                             axes_dims_rope=(2, 2, 4))
        scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_image_seq_len=16,
                                                    max_image_seq_len=256, base_shift=0.5, max_shift=1.15)
        return FluxPipeline(transformer=transformer, scheduler=scheduler, vae=_vae(4, flux=True),
                            text_encoder=_clip(tok, projection=False), tokenizer=tok,
                            text_encoder_2=_t5(tok), tokenizer_2=tok)


@TINY_MODELS.register("sd15")
def tiny_sd15(seed: int = 0):
    """A StableDiffusionPipeline with a DDIM scheduler: a 2-level UNet over a CLIP text encoder."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = _tokenizer()
        unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                    block_out_channels=(16, 32), norm_num_groups=8, cross_attention_dim=32,
                                    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=4)
        scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                  clip_sample=False, set_alpha_to_one=False, steps_offset=1)
        return StableDiffusionPipeline(unet=unet, scheduler=scheduler, vae=_vae(4, sd15=True), text_encoder=_clip(tok, projection=False),
                                       tokenizer=tok, safety_checker=None, feature_extractor=None,
                                       requires_safety_checker=False)


@TINY_MODELS.register("pixel-flow")
def tiny_pixel_flow(seed: int = 0, layers: int = 2, heads: int = 2, head_dim: int = 16, size: int = 16,
                    patch: int = 2):
    """A PixelFlowPipeline (`pixel.py`) for `size` x `size` images."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

    from .pixel import PixelFlowPipeline
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = _tokenizer()
        transformer = SD3Transformer2DModel(sample_size=size, patch_size=patch, in_channels=3, out_channels=3,
                                            num_layers=layers, attention_head_dim=head_dim,
                                            num_attention_heads=heads, joint_attention_dim=32,
                                            caption_projection_dim=heads * head_dim, pooled_projection_dim=32,
                                            pos_embed_max_size=size // patch)
        return PixelFlowPipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
                                 text_encoder=_clip(tok), tokenizer=tok)


@TINY_MODELS.register("pixel-flow-unet")
def tiny_pixel_flow_unet(seed: int = 0, channels: tuple[int, ...] = (32, 64), size: int = 16, head_dim: int = 8):
    """A PixelFlowUNetPipeline (`pixel.py`) for `size` x `size` images: a UNet with one resolution
    level per entry of `channels`, cross-attention to the text below the top level."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UNet2DConditionModel

    from .pixel import PixelFlowUNetPipeline
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = _tokenizer()
        levels = len(channels)
        unet = UNet2DConditionModel(sample_size=size, in_channels=3, out_channels=3, layers_per_block=1,
                                    block_out_channels=tuple(channels), norm_num_groups=8, cross_attention_dim=32,
                                    down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (levels - 1),
                                    up_block_types=("CrossAttnUpBlock2D",) * (levels - 1) + ("UpBlock2D",),
                                    attention_head_dim=head_dim)
        return PixelFlowUNetPipeline(unet=unet, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
                                     text_encoder=_clip(tok), tokenizer=tok)
