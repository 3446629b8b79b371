"""Tiny random pipelines of 2026's generators, assembled in memory from configs (tests, CPU
recipes; no download): Qwen-Image and Qwen-Image-Edit (and Edit-Plus) over a tiny Qwen2.5-VL text encoder, Z-Image and
FLUX.2 [klein] over tiny Qwen3 encoders, FLUX.1 Kontext of tiny:flux's components; Stable Audio 3 (sound) over a tiny T5Gemma encoder, AudioLDM 2
(sound as mel-spectrogram latents) over tiny CLAP, T5 and GPT-2 models."""

from __future__ import annotations

import torch

from ..model_loading import TINY_MODELS
from .tiny_models import chat_template, char_tokenizer, char_tokenizer_with
from .tiny_multimodal import qwen25_vl_char
from .tiny_pipelines import _vae, tiny_flux


@TINY_MODELS.register("qwen-image")
def tiny_qwen_image(seed: int = 0, layers: int = 1):
    """A QwenImagePipeline: a 1-layer Qwen2.5-VL text encoder over characters, a `layers`-block
    Qwen-Image MMDiT on 2x2-packed latents, a one-level Qwen-Image VAE (2x in space), the Euler flow
    scheduler with Qwen-Image's resolution-dependent exponential shift."""
    from diffusers import QwenImagePipeline
    parts = qwen_image_parts(seed, layers)
    parts.pop("processor")
    return QwenImagePipeline(**parts)


@TINY_MODELS.register("qwen-image-edit")
def tiny_qwen_image_edit(seed: int = 0, layers: int = 1):
    """A QwenImageEditPipeline of tiny:qwen-image's components, with the Qwen2.5-VL processor
    that shows its text encoder the source image (at most 112 x 112 pixels, 16 vision tokens)."""
    from diffusers import QwenImageEditPipeline
    return QwenImageEditPipeline(**qwen_image_parts(seed, layers))


@TINY_MODELS.register("qwen-image-edit-plus")
def tiny_qwen_image_edit_plus(seed: int = 0, layers: int = 1):
    """A QwenImageEditPlusPipeline of tiny:qwen-image-edit's components."""
    from diffusers import QwenImageEditPlusPipeline
    return QwenImageEditPlusPipeline(**qwen_image_parts(seed, layers))


def qwen_image_parts(seed: int, layers: int) -> dict:
    """The components of the tiny Qwen-Image pipelines (the editing one's processor included)."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder, processor = qwen25_vl_char(hidden=32, layers=1, heads=2, vision_hidden=16, seed=seed)
        tokenizer = processor.tokenizer
        tokenizer.padding_side = "right"
        transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=layers,
                                                  attention_head_dim=8, num_attention_heads=2,
                                                  joint_attention_dim=32, axes_dims_rope=(2, 2, 4))
        vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 1], num_res_blocks=1,
                                     temperal_downsample=[False], latents_mean=[0.1 * i for i in range(4)],
                                     latents_std=[1.0 + 0.2 * i for i in range(4)])
        scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_image_seq_len=16,
                                                    max_image_seq_len=256, base_shift=0.5, max_shift=0.9,
                                                    shift_terminal=0.02, time_shift_type="exponential")
    return dict(scheduler=scheduler, vae=vae.eval(), text_encoder=text_encoder, tokenizer=tokenizer,
                processor=processor, transformer=transformer)


@TINY_MODELS.register("z-image")
def tiny_z_image(seed: int = 0, layers: int = 1):
    """A ZImagePipeline: a 2-layer Qwen3 text encoder (the pipeline reads its second-to-last hidden
    states) over characters with a chat template, a `layers`-layer Z-Image single-stream DiT (one
    refiner layer each for the latents and the caption), a 2-level VAE (2x in space)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer = char_tokenizer_with(["<|im_start|>", "<|im_end|>"], chat_template())
        text_encoder = Qwen3Model(Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                              head_dim=16, max_position_embeddings=1024,
                                              pad_token_id=tokenizer.pad_token_id)).eval()
        transformer = ZImageTransformer2DModel(in_channels=4, dim=32, n_layers=layers, n_refiner_layers=1, n_heads=2,
                                               n_kv_heads=2, cap_feat_dim=32, axes_dims=[4, 6, 6],
                                               axes_lens=[1024, 32, 32])
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_image_seq_len=16,
                                                    max_image_seq_len=256)
        return ZImagePipeline(scheduler=scheduler, vae=_vae(4, flux=True), text_encoder=text_encoder,
                              tokenizer=tokenizer, transformer=transformer)


@TINY_MODELS.register("flux2-klein")
def tiny_flux2_klein(seed: int = 0, layers: int = 1, distilled: bool = False):
    """A Flux2KleinPipeline (the undistilled base: CFG; `distilled`: the step-distilled model, none):
    a 27-layer Qwen3 of width 8 (the pipeline stacks its hidden states 9, 18 and 27), a FLUX.2
    transformer with `layers` double- and one single-stream block, a 2-level FLUX.2 VAE (2x in space,
    its 2x2 patchify and batch-norm statistics drawn at random so that they matter)."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer = char_tokenizer_with(["<|im_start|>", "<|im_end|>"], chat_template())
        text_encoder = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tokenizer), hidden_size=8, intermediate_size=16,
                                                    num_hidden_layers=27, num_attention_heads=2, num_key_value_heads=1,
                                                    head_dim=4, max_position_embeddings=1024,
                                                    pad_token_id=tokenizer.pad_token_id)).eval()
        transformer = Flux2Transformer2DModel(in_channels=16, num_layers=layers, num_single_layers=1,
                                              attention_head_dim=8, num_attention_heads=2, joint_attention_dim=24,
                                              timestep_guidance_channels=16, axes_dims_rope=(2, 2, 2, 2),
                                              guidance_embeds=False)
        vae = AutoencoderKLFlux2(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                                 up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                                 norm_num_groups=4, sample_size=32).eval()
        vae.bn.running_mean.normal_(0.0, 0.3)
        vae.bn.running_var.uniform_(0.5, 2.0)
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)
        return Flux2KleinPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                  transformer=transformer, is_distilled=distilled)


@TINY_MODELS.register("flux-kontext")
def tiny_flux_kontext(seed: int = 0, layers: int = 1):
    """A FluxKontextPipeline of tiny:flux's components (CLIP + T5, one double and one single block, a
    guidance embedding, a 2-level VAE)."""
    from diffusers import FluxKontextPipeline
    return FluxKontextPipeline(**tiny_flux(seed, layers).components)


@TINY_MODELS.register("stable-audio-3")
def tiny_stable_audio3(seed: int = 0, layers: int = 1):
    """A StableAudio3Pipeline drawing stereo sound at 800 Hz: a 1-layer T5Gemma encoder over
    characters, a `layers`-block Stable Audio 3 DiT, a one-stage SAME autoencoder (8 samples a
    latent frame, 4 latent channels; its residual branches' output projections and
    output tokens, zero or near zero at initialisation, drawn at random), a duration embedder up to 10 s, the plain Euler flow
    scheduler (the base checkpoint's; the distilled one's `stochastic_sampling` is off)."""
    from diffusers import AutoencoderSAME, FlowMatchEulerDiscreteScheduler, StableAudio3DiTModel, StableAudio3Pipeline
    from diffusers.pipelines.stable_audio_3.modeling_stable_audio_3 import StableAudio3DurationEmbedder
    from transformers import T5GemmaConfig, T5GemmaEncoderModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer = char_tokenizer()
        module = dict(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8,
                      sliding_window=64, pad_token_id=tokenizer.pad_token_id)
        text_encoder = T5GemmaEncoderModel(T5GemmaConfig(encoder=module, decoder=module, vocab_size=len(tokenizer),
                                                         is_encoder_decoder=False)).eval()
        vae = AutoencoderSAME(audio_channels=2, patch_size=4, encoder_channels=8, encoder_c_mults=(2,),
                              encoder_strides=(2,), encoder_transformer_depths=(1,), latent_dim=4, dim_heads=8,
                              ff_mult=2, sampling_rate=800).eval()
        with torch.no_grad():  # what SAME zero-initialises, drawn so that the decoded sound depends on the latents
            for name, param in vae.named_parameters():
                if name.endswith(("to_out.weight", "proj_out.weight", "new_tokens")):
                    param.normal_(0.0, 1.0 if name.endswith("new_tokens") else 0.3)
        transformer = StableAudio3DiTModel(io_channels=4, embed_dim=32, depth=layers, num_heads=2, cond_token_dim=16,
                                           global_cond_dim=16, local_add_cond_dim=5, timestep_features_dim=16,
                                           ff_mult=2, num_memory_tokens=2)
        duration_embedder = StableAudio3DurationEmbedder(output_dim=16, fourier_dim=8, max_val=10.0)
        return StableAudio3Pipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                    duration_embedder=duration_embedder, transformer=transformer,
                                    scheduler=FlowMatchEulerDiscreteScheduler())


def letter_tokenizers(max_length: int):
    """AudioLDM 2's two tokenizers over single letters, built as their classes build themselves (so that
    a saved pipeline reloads them alike): a byte-level BPE `RobertaTokenizer` without merges (space is
    the byte symbol "\u0120") for CLAP, a unigram `T5Tokenizer` (space "\u2581") for T5; each
    truncates at `max_length` tokens."""
    from transformers import RobertaTokenizer, T5Tokenizer
    letters = list("abcdefghijklmnopqrstuvwxyz")
    roberta = RobertaTokenizer(vocab={t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "<mask>", "\u0120",
                                                                  *letters])},
                               merges=[], model_max_length=max_length)
    t5 = T5Tokenizer(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0), *((c, -3.0) for c in letters)],
                     extra_ids=0, model_max_length=max_length)
    return roberta, t5


@TINY_MODELS.register("audioldm2")
def tiny_audioldm2(seed: int = 0):
    """An AudioLDM2Pipeline drawing 16 kHz sound: a tiny CLAP (its text tower reads the prompt, 16-d
    projection) and a 1-layer T5 encoder (32-d) over letters, the projection model, a 1-layer GPT-2
    (16-d) that generates the 8 "AudioMAE" embeddings, a 2-level AudioLDM 2 UNet (cross-attention to
    the GPT-2 states and to the T5 states), a 2-level VAE of one mel channel (factor 2), a
    SpeechT5 HiFi-GAN vocoder from 8 mel bins, 4 samples a mel frame (its weights drawn at 0.1, loud enough
    to be heard); the DDIM scheduler. Its default
    length (the UNet's 32 latent frames) is 0.016 s."""
    from diffusers import (AudioLDM2Pipeline, AudioLDM2ProjectionModel, AudioLDM2UNet2DConditionModel, AutoencoderKL,
                           DDIMScheduler)
    from transformers import (ClapAudioConfig, ClapConfig, ClapFeatureExtractor, ClapModel, ClapTextConfig, GPT2Config,
                              GPT2LMHeadModel, SpeechT5HifiGan, SpeechT5HifiGanConfig, T5Config, T5EncoderModel)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer, tokenizer_2 = letter_tokenizers(32)
        text = ClapTextConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, max_position_embeddings=40, pad_token_id=1, projection_dim=16)
        audio = ClapAudioConfig(window_size=4, num_mel_bins=64, spec_size=64, patch_size=4, patch_stride=(4, 4),
                                hidden_size=16, projection_dim=16, depths=[1, 1], num_attention_heads=[2, 2],
                                patch_embeds_hidden_size=16, enable_fusion=False)
        clap = ClapModel(ClapConfig(text_config=text.to_dict(), audio_config=audio.to_dict(), projection_dim=16)).eval()
        t5 = T5EncoderModel(T5Config(vocab_size=len(tokenizer_2), d_model=32, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                     pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)).eval()
        gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=16, n_head=2, n_layer=1, vocab_size=8, n_positions=64, bos_token_id=0, eos_token_id=0)).eval()
        gpt2.config.max_new_tokens = 8
        unet = AudioLDM2UNet2DConditionModel(block_out_channels=(16, 32), layers_per_block=1, sample_size=32,
                                             in_channels=4, out_channels=4, norm_num_groups=8,
                                             down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                             up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
                                             cross_attention_dim=([None, 16, 32], [None, 16, 32]), attention_head_dim=4)
        vae = AutoencoderKL(in_channels=1, out_channels=1, block_out_channels=(8, 8), layers_per_block=1,
                            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                            latent_channels=4, norm_num_groups=4, scaling_factor=0.5).eval()
        vocoder = SpeechT5HifiGan(SpeechT5HifiGanConfig(model_in_dim=8, sampling_rate=16000, upsample_initial_channel=16,
                                                        upsample_rates=[2, 2], upsample_kernel_sizes=[4, 4],
                                                        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]],
                                                        normalize_before=False)).eval()
        with torch.no_grad():  # HiFi-GAN's initialisation draws near-silence (1e-5): drawn so that its sound is heard
            for param in vocoder.parameters():
                param.normal_(0.0, 0.1)
        scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                                  set_alpha_to_one=False, steps_offset=1)
        return AudioLDM2Pipeline(
            vae=vae, text_encoder=clap, text_encoder_2=t5, projection_model=AudioLDM2ProjectionModel(
                text_encoder_dim=16, text_encoder_1_dim=32, langauge_model_dim=16).eval(),
            language_model=gpt2, tokenizer=tokenizer, tokenizer_2=tokenizer_2,
            feature_extractor=ClapFeatureExtractor(feature_size=64, sampling_rate=48000, hop_length=960, max_length_s=1),
            unet=unet, scheduler=scheduler, vocoder=vocoder)
