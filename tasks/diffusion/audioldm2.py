"""The AudioLDM 2 family (`AudioLDM2Pipeline`): text-to-audio by DDPM (epsilon prediction) on the
VAE's latents of a mel spectrogram [C, T/f, M/f] (T mel frames of M bins, f the VAE's factor), the
SD 1.5 family's DDIM scheduler, levels and DDIM-SDE step. The prompt's conditioning is the
pipeline's own `encode_prompt`, once per prompt: the CLAP text embedding and the T5 (Flan-T5)
states, projected and read by the GPT-2 language model, which generates 8 "AudioMAE" states
deterministically; the UNet cross-attends to the GPT-2 states and to the T5 states (with their mask).
Each prompt is encoded alone, as the stock call with that prompt: the GPT-2 reads the T5 states
with their padding, so a prompt's conditioning would depend on the longest prompt beside it. The T5
states are then padded to the tokenizer's `model_max_length` (mask 0, which the UNet's attention
masks) so that rows encoded apart join. CFG is one batched call on [uncond, cond], u + g (c - u),
the empty prompt as the negative (the stock call's default). The length is `policy.duration`
seconds (null: the pipeline's, the UNet's `sample_size` latent frames: 10.24 s for cvssp/audioldm2),
as the pipeline rounds it: int(seconds / hop) mel frames, up to a multiple of the VAE's factor. A
completion is the vocoder's waveform (SpeechT5 HiFi-GAN) of the decoded mel spectrogram, cut to the
duration's samples: {"array": float32 [S], "sampling_rate": the vocoder's}. A checkpoint whose language
model is a bare `GPT2Model` (cvssp/audioldm2's) cannot run the stock call on transformers 5 (no
generation methods: diffusers issue #12630): the family wraps it in a `GPT2LMHeadModel` around the
same weights, the head tied to the embeddings, as the pipeline declares it."""

from __future__ import annotations

import math

import numpy as np
import torch

from .family import FAMILIES, Configs, split_cond
from .families import SD15


@FAMILIES.register("audioldm2")
class AudioLDM2(SD15):
    pipeline = "AudioLDM2Pipeline"
    output = "audio"
    duration: float | None = None  # seconds of sound (`policy.duration`); None: the pipeline's default

    def __init__(self, pipe, size, num_frames=1):
        super().__init__(pipe, size, num_frames)
        with_generating_language_model(pipe)

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """Sound has no height or width: any (policy.height and policy.width are unused)."""
        return 1

    @classmethod
    def duration_problem(cls, configs: Configs, seconds: float) -> str | None:
        """Any positive length: the UNet is convolutional (the pipeline rounds it up to whole latent frames)."""
        return None if seconds > 0 else f"policy.duration={seconds}: {cls.pipeline} draws a positive number of seconds"

    def set_duration(self, seconds: float) -> None:
        if problem := self.duration_problem({}, seconds):
            raise ValueError(problem)
        self.duration = float(seconds)

    @property
    def sampling_rate(self) -> int:
        return int(self.pipe.vocoder.config.sampling_rate)

    def _hop(self) -> float:
        """Seconds of sound per mel frame: the vocoder's upsampling over its sampling rate."""
        return float(np.prod(self.pipe.vocoder.config.upsample_rates)) / self.sampling_rate

    def _seconds(self) -> float:
        f = self.pipe.vae_scale_factor
        return self.duration if self.duration is not None else self.denoiser.config.sample_size * f * self._hop()

    def encode(self, prompts, guided):
        rows = [self._encoded(p, guided) for p in prompts]
        return {k: torch.cat([row[k] for row in rows]) for k in rows[0]}

    def _encoded(self, prompt: str, guided: bool) -> dict[str, torch.Tensor]:
        """One prompt's conditioning, as the stock call encodes it alone: `side/embeds` the T5 states
        [1, L, D] padded to L = the tokenizer's `model_max_length`, `side/mask` [1, L], `side/generated`
        the GPT-2's states [1, 8, D_lm]."""
        embeds, mask, generated = self.pipe.encode_prompt([prompt], self.device, 1, guided)
        sides = ("neg", "pos") if guided else ("pos",)  # the stock call's [uncond, cond] halves
        width = self.pipe.tokenizer_2.model_max_length
        out = {}
        for i, side in enumerate(sides):
            pad = width - embeds.shape[1]
            out[f"{side}/embeds"] = torch.nn.functional.pad(embeds[i:i + 1], (0, 0, 0, pad)).to(self.dtype)
            out[f"{side}/mask"] = torch.nn.functional.pad(mask[i:i + 1], (0, pad))
            out[f"{side}/generated"] = generated[i:i + 1].to(self.dtype)
        return out

    def noise(self, generator, height, width):
        f = self.pipe.vae_scale_factor
        frames = math.ceil(int(self._seconds() / self._hop()) / f)
        shape = (1, self.denoiser.config.in_channels, frames, int(self.pipe.vocoder.config.model_in_dim) // f)
        return torch.randn(shape, generator=generator, dtype=torch.float32) * self.pipe.scheduler.init_noise_sigma

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)

        def run(h, c):
            return model(h.to(self.dtype), t.expand(h.shape[0]).to(h.device), encoder_hidden_states=c["generated"],
                         encoder_hidden_states_1=c["embeds"], encoder_attention_mask_1=c["mask"],
                         return_dict=False)[0]
        return self._guided(run, x, pos, neg if guided else None, guidance_scale)

    def waveforms(self, latents: torch.Tensor) -> torch.Tensor:
        """The pipeline's output of latents [B, C, T/f, M/f]: the vocoder's waveforms [B, S] of the decoded
        mel spectrograms, cut to the duration's samples."""
        vae = self.pipe.vae
        mel = vae.decode((latents / vae.config.scaling_factor).to(vae.dtype)).sample
        return self.pipe.mel_spectrogram_to_waveform(mel)[:, :int(self._seconds() * self.sampling_rate)]

    def decode(self, latents, height, width):
        return [{"array": a.float().numpy(), "sampling_rate": self.sampling_rate} for a in self.waveforms(latents)]

    def image_latents(self, pixels):
        raise ValueError(f"{type(self.pipe).__name__} draws sound: the supervised warm start encodes images")


def with_generating_language_model(pipe) -> None:
    """Give the pipeline a language model with the generation methods its `generate_language_model`
    calls: a bare `GPT2Model` is wrapped in a `GPT2LMHeadModel` holding it (its head the tied embeddings)."""
    from transformers import GenerationMixin, GPT2LMHeadModel
    bare = pipe.language_model
    if isinstance(bare, GenerationMixin):
        return
    with torch.device("meta"):
        wrapped = GPT2LMHeadModel(bare.config)
    wrapped.transformer = bare
    wrapped.lm_head = torch.nn.Linear(bare.config.n_embd, bare.config.vocab_size, bias=False)
    wrapped.lm_head.weight = bare.wte.weight
    pipe.register_modules(language_model=wrapped.eval())
