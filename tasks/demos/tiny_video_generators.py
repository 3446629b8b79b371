"""Tiny random video pipelines of 2026's generators, assembled in memory from configs (tests, CPU
recipes; no download): Wan 2.2 A14B's text- and image-to-video pipelines with their two experts, HunyuanVideo 1.5's
text-to-video pipeline, LTX-2's text (and image) to video with sound."""

from __future__ import annotations

import torch

from ..model_loading import TINY_MODELS
from .tiny_multimodal import gemma3_char, qwen25_vl_char
from .tiny_pipelines import _umt5, _wan_transformer, _wan_vae, pipeline_tokenizer

# Wan 2.2 T2V-A14B's switch: the high-noise expert denoises timesteps >= 0.875 * 1000 (its
# model_index.json; the I2V-A14B checkpoint's is 0.9)
WAN22_A14B_BOUNDARY = 0.875
WAN22_I2V_A14B_BOUNDARY = 0.9


def _two_experts(pipeline_class: str, channels: int, seed: int, layers: int, boundary_ratio: float):
    """A Wan pipeline of class `pipeline_class` (diffusers) with two experts of `channels` input channels."""
    import diffusers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = pipeline_tokenizer()
        return getattr(diffusers, pipeline_class)(
            tokenizer=tok, text_encoder=_umt5(tok), vae=_wan_vae(), transformer=_wan_transformer(channels, layers),
            transformer_2=_wan_transformer(channels, layers),
            scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0), boundary_ratio=boundary_ratio)


@TINY_MODELS.register("wan22-a14b")
def tiny_wan22_a14b(seed: int = 0, layers: int = 1, boundary_ratio: float = WAN22_A14B_BOUNDARY):
    """A WanPipeline as Wan 2.2 T2V-A14B is one: a UMT5 encoder, two `layers`-layer Wan video
    transformers of the same shape drawn apart (`transformer`, the high-noise expert, and
    `transformer_2`, the low-noise one) switched at `boundary_ratio` * 1000, the Wan VAE (4x time,
    4x space), the flow-matching Euler scheduler with Wan's shift 3 (3 steps: one high-noise step,
    two low-noise ones)."""
    return _two_experts("WanPipeline", 4, seed, layers, boundary_ratio)


@TINY_MODELS.register("wan22-a14b-i2v")
def tiny_wan22_a14b_i2v(seed: int = 0, layers: int = 1, boundary_ratio: float = WAN22_I2V_A14B_BOUNDARY):
    """A WanImageToVideoPipeline as Wan 2.2 I2V-A14B is one: as tiny:wan22-a14b, but each expert reads
    the noisy latents concatenated with the first-frame mask and the image's latents (4 + 4 + 4
    channels), no CLIP image encoder (Wan 2.2 drops it), the switch at 0.9 * 1000."""
    return _two_experts("WanImageToVideoPipeline", 12, seed, layers, boundary_ratio)


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


@TINY_MODELS.register("ltx2")
def tiny_ltx2(seed: int = 0, layers: int = 1, perturbed_attn: bool = False):
    """An LTX2Pipeline (text to video with sound): a 2-layer Gemma 3 over characters (the pipeline
    stacks its 3 hidden states), the text connectors (one layer for each stream), a `layers`-layer
    LTX-2 audio-video transformer (4 video channels; audio latents of 2 channels over 2 mel bins,
    4 features a token; `perturbed_attn`: self-attention that spatio-temporal guidance can skip, the
    transformer config's switch), the LTX-2 video VAE (2x space, 2x time), the audio VAE (16 kHz mels of 8
    bins, hop 160, 4x time), a vocoder upsampling 4x (so its sound is 400 samples a second, which
    its `output_sampling_rate` says), and the Euler flow scheduler."""
    from diffusers import (AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler,
                           LTX2Pipeline, LTX2VideoTransformer3DModel)
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    text_encoder, processor = gemma3_char(hidden=32, layers=2, heads=2, vision_hidden=16, seed=seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = LTX2VideoTransformer3DModel(
            in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
            cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
            audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=layers, qk_norm="rms_norm_across_heads",
            caption_channels=32, rope_double_precision=False, rope_type="split", perturbed_attn=perturbed_attn)
        connectors = LTX2TextConnectors(
            caption_channels=32, text_proj_in_factor=3, video_connector_num_attention_heads=2,
            video_connector_attention_head_dim=16, video_connector_num_layers=1,
            video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=2,
            audio_connector_attention_head_dim=16, audio_connector_num_layers=1,
            audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_theta=10000.0,
            rope_double_precision=False, causal_temporal_positioning=False, rope_type="split")
        vae = AutoencoderKLLTX2Video(
            latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,), layers_per_block=(1,),
            decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,), decoder_spatio_temporal_scaling=(True,),
            decoder_inject_noise=(False, False), downsample_type=("spatial",), upsample_residual=(False,),
            upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
            decoder_causal=False).eval()
        audio_vae = AutoencoderKLLTX2Audio(
            base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
            resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
            mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8).eval()
        vocoder = LTX2Vocoder(in_channels=2 * 8, hidden_channels=16, out_channels=2, upsample_kernel_sizes=[4, 4],
                              upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
                              output_sampling_rate=16000 // 160 * 4).eval()
        return LTX2Pipeline(transformer=transformer, vae=vae, audio_vae=audio_vae, vocoder=vocoder,
                            scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=text_encoder,
                            tokenizer=processor.tokenizer, connectors=connectors)


@TINY_MODELS.register("ltx2-i2v")
def tiny_ltx2_i2v(seed: int = 0, layers: int = 1, perturbed_attn: bool = False):
    """An LTX2ImageToVideoPipeline of tiny:ltx2's components (image to video with sound)."""
    from diffusers import LTX2ImageToVideoPipeline
    return LTX2ImageToVideoPipeline(**tiny_ltx2(seed, layers, perturbed_attn).components)
