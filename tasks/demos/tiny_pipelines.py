"""Tiny random diffusers pipelines assembled in memory (tests, CPU recipes, the t2i demo; no download):
SD3, FLUX.1 and SD 1.5 with tiny CLIP / T5 text encoders over the character tokenizer, and the
demo's pixel-space flow pipeline."""

from __future__ import annotations

import torch
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

from ..model_loading import TINY_MODELS
from .tiny_models import char_tokenizer

MAX_PROMPT = 16


def pipeline_tokenizer(max_length: int = MAX_PROMPT):
    """The character tokenizer of the tiny pipelines, padded on the right to `max_length` tokens."""
    tok = char_tokenizer()
    tok.padding_side = "right"
    tok.model_max_length = max_length
    return tok


def _clip(tok, hidden=32, projection=True):
    config = CLIPTextConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                            num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=tok.model_max_length,
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
        tok = pipeline_tokenizer()
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
        tok = pipeline_tokenizer()
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
        tok = pipeline_tokenizer()
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
        tok = pipeline_tokenizer()
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
        tok = pipeline_tokenizer()
        levels = len(channels)
        unet = UNet2DConditionModel(sample_size=size, in_channels=3, out_channels=3, layers_per_block=1,
                                    block_out_channels=tuple(channels), norm_num_groups=8, cross_attention_dim=32,
                                    down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (levels - 1),
                                    up_block_types=("CrossAttnUpBlock2D",) * (levels - 1) + ("UpBlock2D",),
                                    attention_head_dim=head_dim)
        return PixelFlowUNetPipeline(unet=unet, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
                                     text_encoder=_clip(tok), tokenizer=tok)


@TINY_MODELS.register("pixel-flow-edit")
def tiny_pixel_flow_edit(seed: int = 0, channels: tuple[int, ...] = (32, 64), size: int = 16, head_dim: int = 8):
    """A PixelFlowEditPipeline (`pixel.py`) for `size` x `size` edits: the pixel-flow UNet with the
    source image's 3 channels after the noisy image's; instructions of up to 32 characters
    ("make the circle yellow")."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UNet2DConditionModel

    from .pixel import PixelFlowEditPipeline
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = pipeline_tokenizer(max_length=32)
        levels = len(channels)
        unet = UNet2DConditionModel(sample_size=size, in_channels=6, out_channels=3, layers_per_block=1,
                                    block_out_channels=tuple(channels), norm_num_groups=8, cross_attention_dim=32,
                                    down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (levels - 1),
                                    up_block_types=("CrossAttnUpBlock2D",) * (levels - 1) + ("UpBlock2D",),
                                    attention_head_dim=head_dim)
        return PixelFlowEditPipeline(unet=unet, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
                                     text_encoder=_clip(tok), tokenizer=tok)


@TINY_MODELS.register("pixel-flow-video")
def tiny_pixel_flow_video(seed: int = 0, channels: tuple[int, ...] = (32, 64), size: int = 16, head_dim: int = 8,
                          frames: int = 4):
    """A PixelFlowVideoPipeline (`pixel.py`) for clips of `frames` frames of `size` x `size`: the
    pixel-flow UNet with the frames stacked on its in and out channels; prompts of up to 32
    characters ("yellow square moving right")."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UNet2DConditionModel

    from .pixel import PixelFlowVideoPipeline
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = pipeline_tokenizer(max_length=32)
        levels = len(channels)
        unet = UNet2DConditionModel(sample_size=size, in_channels=3 * frames, out_channels=3 * frames,
                                    layers_per_block=1, block_out_channels=tuple(channels), norm_num_groups=8,
                                    cross_attention_dim=32,
                                    down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (levels - 1),
                                    up_block_types=("CrossAttnUpBlock2D",) * (levels - 1) + ("UpBlock2D",),
                                    attention_head_dim=head_dim)
        return PixelFlowVideoPipeline(unet=unet, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
                                      text_encoder=_clip(tok), tokenizer=tok)


def _umt5(tok, hidden=32):
    from transformers import UMT5Config, UMT5EncoderModel
    config = UMT5Config(vocab_size=len(tok), d_model=hidden, d_kv=8, d_ff=2 * hidden, num_layers=1, num_heads=2,
                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=0)
    return UMT5EncoderModel(config).eval()


def _wan_vae(z_dim=4):
    """A Wan video VAE (causal 3D convolutions): 4x in time, 4x in space (two temporal downsamplings)."""
    from diffusers import AutoencoderKLWan
    return AutoencoderKLWan(base_dim=8, z_dim=z_dim, dim_mult=[1, 1, 1], num_res_blocks=1, temperal_downsample=[True, True],
                            latents_mean=[0.1 * i for i in range(z_dim)], latents_std=[1.0 + 0.2 * i for i in range(z_dim)],
                            scale_factor_spatial=4, scale_factor_temporal=4).eval()


def _wan_transformer(in_channels, layers, image_dim=None):
    from diffusers import WanTransformer3DModel
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                                 in_channels=in_channels, out_channels=4, text_dim=32, freq_dim=16, ffn_dim=32,
                                 num_layers=layers, image_dim=image_dim, added_kv_proj_dim=image_dim and 16,
                                 rope_max_seq_len=32)


@TINY_MODELS.register("wan-t2v")
def tiny_wan_t2v(seed: int = 0, layers: int = 1):
    """A WanPipeline (Wan 2.1 text-to-video): a UMT5 encoder, a 1-layer Wan video transformer, a
    Wan VAE (4x time, 4x space), the flow-matching Euler scheduler with Wan's shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = pipeline_tokenizer()
        return WanPipeline(tokenizer=tok, text_encoder=_umt5(tok), vae=_wan_vae(),
                           transformer=_wan_transformer(4, layers), scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


@TINY_MODELS.register("wan-i2v")
def tiny_wan_i2v(seed: int = 0, layers: int = 1):
    """A WanImageToVideoPipeline (Wan 2.1 image-to-video): as tiny:wan-t2v, plus a CLIP vision
    encoder of the conditioning image; the transformer reads the noisy latents concatenated with
    the first-frame mask and the image's latents (4 + 4 + 4 channels)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = pipeline_tokenizer()
        vision = CLIPVisionModel(CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                  num_attention_heads=2, image_size=32, patch_size=8)).eval()
        processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        return WanImageToVideoPipeline(tokenizer=tok, text_encoder=_umt5(tok), vae=_wan_vae(),
                                       transformer=_wan_transformer(12, layers, image_dim=16),
                                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                                       image_processor=processor, image_encoder=vision)


@TINY_MODELS.register("hunyuan-video")
def tiny_hunyuan_video(seed: int = 0, layers: int = 1):
    """A HunyuanVideoPipeline: a tiny Llama and CLIP text encoder, a HunyuanVideo transformer (one
    dual- and one single-stream block, guidance embedding), its causal 3D VAE (4x time, 2x space).
    The Llama tokenizer pads and truncates on the left: the pipeline's prompt template (500 characters,
    a character each) keeps its end, the prompt, within the tokens it reads after cropping the first 95."""
    from diffusers import (AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline,
                           HunyuanVideoTransformer3DModel)
    from transformers import LlamaConfig, LlamaModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = pipeline_tokenizer()
        tok.padding_side = tok.truncation_side = "left"
        llama = LlamaModel(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                                       pad_token_id=tok.pad_token_id)).eval()
        clip_tok = char_tokenizer()
        clip = CLIPTextModel(CLIPTextConfig(vocab_size=len(clip_tok), hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=77,
                                            pad_token_id=clip_tok.pad_token_id, eos_token_id=clip_tok.eos_token_id,
                                            bos_token_id=clip_tok.eos_token_id)).eval()
        transformer = HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                                     attention_head_dim=8, num_layers=layers, num_single_layers=1,
                                                     num_refiner_layers=1, patch_size=1, patch_size_t=1,
                                                     text_embed_dim=32, pooled_projection_dim=32, rope_axes_dim=(2, 2, 4))
        vae = AutoencoderKLHunyuanVideo(latent_channels=4, block_out_channels=(8, 8, 8), layers_per_block=1,
                                        down_block_types=("HunyuanVideoDownBlock3D",) * 3,
                                        up_block_types=("HunyuanVideoUpBlock3D",) * 3, norm_num_groups=4,
                                        spatial_compression_ratio=2, temporal_compression_ratio=4,
                                        mid_block_add_attention=False).eval()
        return HunyuanVideoPipeline(text_encoder=llama, tokenizer=tok, transformer=transformer, vae=vae,
                                    scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=clip,
                                    tokenizer_2=clip_tok)
