"""The LTX-2 families: `LTX2Pipeline` (text to video with its sound) and `LTX2ImageToVideoPipeline`
(the same from an image, its class's docstring). One DiT denoises the video
latents and the audio latents together (each stream attends to the other), over a Gemma 3 text
model's stacked hidden states passed through the pipeline's text connectors (one embedding for the
video stream, one for the audio stream, and their mask).

The action unit holds both: the latents are one flat vector per rollout [B, D_v + D_a], the
packed video latents [S_v, C_v] (S_v = frames x height x width in latents) flattened, then the
packed audio latents [L, C_a M] (L latent audio frames of C_a channels over M mel bins)
flattened; a denoising step moves both and its Gaussian log-density is the mean over all D_v + D_a
dims (docs/methods.md). The initial noise is the stock call's: the video's, then the audio's, from
one generator. The step levels are the stock call's: sigmas linspace(1, 1/n, n) through the
scheduler with the shift `mu` of the video's token count; the model reads the scheduler's
timesteps (1000 sigma) for both streams. Classifier-free guidance is one batched call on
[uncond, cond] with the empty prompt as the negative, u + g (c - u) on both streams at g =
`policy.guidance_scale`: the stock call with `audio_guidance_scale` equal to `guidance_scale`; its
spatio-temporal guidance, modality isolation and guidance rescale (`policy.stg_scale`,
`stg_blocks`, `modality_scale`, `guidance_rescale`; off by default) join it in x0 space as the
stock call combines them (`ltx2_guidance.py`). The frame rate is `policy.fps` (24 by
default, the stock call's): it sets the audio's length (num_frames / fps seconds) and the
positions the model reads. A completion is a video with its sound: {"frames": the PIL frames,
"array": float32 [S] mono (the vocoder's channels' mean), "sampling_rate": the vocoder's rate}
(docs/rewards.md)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .family import FAMILIES, Configs, split_cond
from .ltx2_guidance import GuidanceTerms, blocks_problem, guided_streams
from .video_families import VideoFamily


@FAMILIES.register("ltx2")
class LTX2(VideoFamily):
    pipeline = "LTX2Pipeline"
    output = "audio_video"
    batched_guidance = True  # the stock call runs [uncond, cond] as one batch
    fps = 24  # the stock call's frame_rate
    max_sequence_length = 1024  # the stock call's prompt length (Gemma, left-padded)
    frame_rate = 24.0  # this run's frames per second (`check_settings`: policy.fps or `fps`)
    fixed_frames = 0  # leading latent frames that condition and are not denoised (image to video: 1)
    guidance_terms = GuidanceTerms()  # STG, modality isolation, rescale (`check_settings`: the policy's)

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """32: the stock call refuses any other height and width (LTX-2's VAE compresses space 32x, patch 1)."""
        return 32

    def _temporal_factor(self) -> int:
        return self.pipe.vae_temporal_compression_ratio

    def check_settings(self, cfg):
        super().check_settings(cfg)
        self.frame_rate = float(cfg.fps or self.fps)
        self.guidance_terms = GuidanceTerms.of(cfg)

    @classmethod
    def guidance_terms_problem(cls, configs, cfg):
        """LTX-2 takes STG, modality isolation and guidance rescale; STG's blocks must be the transformer's."""
        return blocks_problem(GuidanceTerms.of(cfg), configs.get("transformer") or {})

    # ----- the latents' geometry
    def _video_grid(self) -> tuple[int, int, int]:
        """(frames, height, width) of the video latents."""
        pipe, (height, width) = self.pipe, self.size
        return ((self.num_frames - 1) // pipe.vae_temporal_compression_ratio + 1,
                height // pipe.vae_spatial_compression_ratio, width // pipe.vae_spatial_compression_ratio)

    def _audio_frames(self) -> int:
        """Latent audio frames of the video's duration, as the stock call rounds them."""
        pipe = self.pipe
        per_second = pipe.audio_sampling_rate / pipe.audio_hop_length / float(pipe.audio_vae_temporal_compression_ratio)
        return round(self.num_frames / self.frame_rate * per_second)

    def _mel_bins(self) -> int:
        return self.pipe.audio_vae.config.mel_bins // self.pipe.audio_vae_mel_compression_ratio

    def _split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(packed video latents of the unit [B, S_v, C_v], packed audio latents [B, L, C_a M]) of flat latents [B, D]."""
        frames, height, width = self._video_grid()
        tokens = (frames - self.fixed_frames) * height * width
        video_dim = tokens * self.pipe.transformer.config.in_channels
        return (x[:, :video_dim].reshape(len(x), tokens, -1),
                x[:, video_dim:].reshape(len(x), self._audio_frames(), -1))

    def noise(self, generator, height, width):
        frames, h, w = self._video_grid()
        video = torch.randn((1, self.denoiser.config.in_channels, frames, h, w), generator=generator)
        audio = torch.randn((1, self.pipe.audio_vae.config.latent_channels, self._audio_frames(), self._mel_bins()),
                            generator=generator)
        pipe = self.pipe
        packed = pipe._pack_latents(video, pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size)
        packed = packed[:, self.fixed_frames * h * w:]  # a conditioning frame's noise is drawn, then replaced
        return torch.cat([packed.flatten(1), pipe._pack_audio_latents(audio).flatten(1)], dim=1)

    def levels(self, num_steps, latent_shape):
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift
        config = self.pipe.scheduler.config
        frames, height, width = self._video_grid()
        mu = calculate_shift(frames * height * width, config.get("base_image_seq_len", 1024),
                             config.get("max_image_seq_len", 4096), config.get("base_shift", 0.95),
                             config.get("max_shift", 2.05))
        self.pipe.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu, device="cpu")
        return self.pipe.scheduler.sigmas.tolist(), self.pipe.scheduler.timesteps.clone()

    # ----- conditioning and the denoiser
    def encode(self, prompts, guided):
        pipe, out = self.pipe, {}
        side = (pipe.tokenizer.padding_side if pipe.tokenizer is not None else "left")
        for name, texts in (("pos", list(prompts)), ("neg", [""] * len(prompts) if guided else None)):
            if texts is not None:
                embeds, mask, _, _ = pipe.encode_prompt(texts, do_classifier_free_guidance=False, device=self.device,
                                                        max_sequence_length=self.max_sequence_length)
                video, audio, mask = pipe.connectors(embeds, mask, padding_side=side)
                out.update({f"{name}/video": video.to(self.dtype), f"{name}/audio": audio.to(self.dtype),
                            f"{name}/mask": mask})
        return out

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)
        text = ("video", "audio", "mask")  # what the guidance passes differ by (an image condition is read from `pos`)
        prompt = {k: pos[k] for k in text}
        if guided and self.guidance_terms.on:
            return self._unit_velocity(*self._stock_guided(model, x, t, pos, {k: neg[k] for k in text}, guidance_scale))
        return self._guided(lambda h, c: self._unit_velocity(*self._velocities(model, h, t, c, pos)), x, prompt,
                            {k: neg[k] for k in text} if guided else None, guidance_scale)

    def _velocities(self, model, h: Tensor, t: Tensor, c: dict, pos: dict, **perturbation) -> tuple[Tensor, Tensor]:
        """The model's fp32 velocities (the video's over all its tokens [N, S, C_v], an image's
        included; the sound's [N, L, C_a M]) at flat latents h [N, D], text conditioning `c` [N, ...]
        and the transformer's `perturbation` keywords (STG's blocks, modality isolation)."""
        frames, height, width = self._video_grid()
        video, audio = self._split(h)
        timestep = t.expand(len(h)).to(h.device)
        video, video_timestep = self._video_input(video, timestep, pos)
        v, a = model(hidden_states=video.to(self.dtype), audio_hidden_states=audio.to(self.dtype),
                     encoder_hidden_states=c["video"], audio_encoder_hidden_states=c["audio"],
                     timestep=video_timestep, audio_timestep=timestep, sigma=timestep,
                     encoder_attention_mask=c["mask"], audio_encoder_attention_mask=c["mask"],
                     num_frames=frames, height=height, width=width, fps=self.frame_rate,
                     audio_num_frames=self._audio_frames(), use_cross_timestep=True, return_dict=False,
                     **perturbation)
        return v.float(), a.float()

    def _unit_velocity(self, video: Tensor, audio: Tensor) -> Tensor:
        """The flat velocity [N, D] of the unit's tokens (the conditioning frame's dropped) of a video's
        velocity over all its tokens [N, S, C_v] and the sound's [N, L, C_a M]."""
        _, height, width = self._video_grid()
        return torch.cat([video[:, self.fixed_frames * height * width:].flatten(1), audio.flatten(1)], dim=1)

    def _stock_guided(self, model, x: Tensor, t: Tensor, pos: dict, neg: dict, guidance_scale: float) -> list[Tensor]:
        """The stock call's guided velocities (video over all its tokens, sound) with STG, modality
        isolation and guidance rescale (`ltx2_guidance.py`): CFG's batched [uncond, cond] forward,
        then the prompt's STG forward and its isolated one, as the stock call orders them."""
        terms, prompt = self.guidance_terms, {k: pos[k] for k in neg}
        joint = {k: torch.cat([neg[k], pos[k]]) for k in neg}
        uncond, cond = zip(*(v.chunk(2) for v in self._velocities(model, torch.cat([x, x]), t, joint, pos)))
        stg = self._velocities(model, x, t, prompt, pos, spatio_temporal_guidance_blocks=list(terms.stg_blocks)) \
            if terms.stg_scale > 0 else None
        isolated = self._velocities(model, x, t, prompt, pos, isolate_modalities=True) \
            if terms.modality_scale > 1 else None
        video, audio = self._split(x.float())
        video = self._video_input(video, t.expand(len(x)).to(x.device), pos)[0]  # x0 of all the video's tokens (the rescale's std)
        sigma = t.flatten()[0].float() / self.pipe.scheduler.config.num_train_timesteps  # a 0-dim tensor: no device sync
        return guided_streams((video, audio), cond, uncond, stg, isolated, sigma, guidance_scale, terms)

    def _video_input(self, video: Tensor, timestep: Tensor, cond: dict) -> tuple[Tensor, Tensor]:
        """(the model's video tokens [B, S, C_v], their timesteps [B] or [B, S]) of the unit's tokens
        (image to video: after the conditioning frame's, at timestep 0)."""
        return video, timestep

    # ----- decoding
    def _video(self, latents: Tensor) -> Tensor:
        """Decoded video [B, 3, T, H, W] of packed video latents (decode timestep 0, the stock default)."""
        pipe, vae = self.pipe, self.pipe.vae
        unpacked = pipe._unpack_latents(latents, *self._video_grid(), pipe.transformer_spatial_patch_size,
                                        pipe.transformer_temporal_patch_size)
        unpacked = pipe._denormalize_latents(unpacked, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
        timestep = torch.zeros(len(latents), device=latents.device, dtype=vae.dtype) \
            if vae.config.timestep_conditioning else None
        return vae.decode(unpacked.to(vae.dtype), timestep, return_dict=False)[0]

    def waveforms(self, latents: Tensor) -> Tensor:
        """The vocoder's sound [B, channels, S] of packed audio latents [B, L, C_a M]."""
        pipe, audio_vae = self.pipe, self.pipe.audio_vae
        audio = pipe._denormalize_audio_latents(latents, audio_vae.latents_mean, audio_vae.latents_std)
        audio = pipe._unpack_audio_latents(audio, self._audio_frames(), num_mel_bins=self._mel_bins())
        mel = audio_vae.decode(audio.to(audio_vae.dtype), return_dict=False)[0]
        return pipe.vocoder(mel)

    def _whole_video(self, video: Tensor, cond: dict) -> Tensor:
        """The whole video's packed latents of the unit's [B, S_v, C_v] (image to video: after the image's)."""
        return video

    @property
    def sampling_rate(self) -> int:
        return int(self.pipe.vocoder.config.output_sampling_rate)

    def decode(self, latents, height, width):
        return self.decode_conditioned(latents, {}, height, width)

    def decode_conditioned(self, latents, cond, height, width):
        video, audio = self._split(latents)
        frames = self._frames(self._video(self._whole_video(video, cond)))
        return [{"frames": f, "array": w.float().mean(0).detach().cpu().numpy(), "sampling_rate": self.sampling_rate}
                for f, w in zip(frames, self.waveforms(audio))]


@FAMILIES.register("ltx2_i2v")
class LTX2ImageToVideo(LTX2):
    """LTX-2 image to video with its sound (`LTX2ImageToVideoPipeline`): the prompt's image
    (`policy.image_column`; re-compressed as the stock call does, H.264 at the CRF of the text
    encoder's generation, then resized) is the first latent frame, clean. Its tokens are not in the
    action unit: the model reads them at timestep 0 beside the denoised ones (per-token timesteps, as
    the stock call), the steps move only the other frames and the sound, and decoding puts them back
    first. Needs the transformer's temporal patch of 1 (LTX-2's)."""

    pipeline = "LTX2ImageToVideoPipeline"
    conditioning_image = True
    fixed_frames = 1

    def image_condition(self, images):
        from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf, resolve_default_image_crf
        from PIL import Image
        pipe, (height, width) = self.pipe, self.size
        vae, crf = pipe.vae, resolve_default_image_crf(pipe.text_encoder)
        first = []
        for image in images:
            if crf != 0:
                image = Image.fromarray(apply_image_conditioning_crf(np.array(image.convert("RGB")), crf))
            pixels = pipe.video_processor.preprocess(image, height=height, width=width).to(self.device, vae.dtype)
            z = vae.encode(pixels.unsqueeze(2)).latent_dist.mode().float()  # [1, C_v, 1, h, w]
            z = pipe._normalize_latents(z, vae.latents_mean, vae.latents_std)
            first.append(pipe._pack_latents(z, pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size))
        return {"pos/first": torch.cat(first)}  # [B, h w, C_v]: kept once, read by both CFG passes

    def _video_input(self, video, timestep, cond):
        first = cond["first"].to(video.device, video.dtype)
        first = first.repeat(len(video) // len(first), 1, 1)  # [uncond, cond] rows: the rows twice
        clean = torch.cat([torch.ones(first.shape[:2]), torch.zeros(video.shape[:2])], dim=1).to(video.device)
        return torch.cat([first, video], dim=1), timestep[:, None] * (1 - clean)

    def _whole_video(self, video, cond):
        return torch.cat([cond["pos/first"].to(video.device, video.dtype), video], dim=1)
