"""The Stable Audio 3 family (`StableAudio3Pipeline`): text-to-audio by rectified flow on the
SAME autoencoder's latents [C, L] (a sequence of L latent frames of C channels). The prompt is
the T5Gemma encoder's states (padded to the pipeline's 256 tokens, with their mask), and the
duration in seconds (`policy.duration`, the pipeline's 10 s by default) enters twice, as the
pipeline does: its embedding is the DiT's global (AdaLN) conditioning and one more cross-attention
token after the text. The step levels are the pipeline's log-SNR-warped sigmas (log-SNR -6.2 to
2, equal steps) and the DiT takes the scheduler's timesteps (1000 sigma). CFG is one batched call
on [uncond, cond], u + g (c - u), the empty prompt as the negative (the distilled checkpoint bakes
its guidance in: `policy.classifier_free_guidance=false`). A completion is the decoded waveform,
cut to the duration and clamped to [-1, 1] as the pipeline's, downmixed to mono (the channels'
mean) for the rewards: {"array": float32 [S], "sampling_rate": the VAE's rate}. The stock
pipeline's ping-pong sampler of the distilled checkpoint (`stochastic_sampling`) is the adapter's
`sampler: cps` at `noise_level: 1`; its ODE path is the base checkpoint's Euler sampling."""

from __future__ import annotations

import math

import torch

from .family import FAMILIES, Configs, Family, split_cond


@FAMILIES.register("stable_audio3")
class StableAudio3(Family):
    pipeline = "StableAudio3Pipeline"
    output = "audio"
    logsnr_range = (-6.2, 2.0)  # the pipeline's logsnr_min, logsnr_max: the step levels' span
    duration = 10.0  # seconds of sound (the pipeline's default; `policy.duration`)

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """Sound has no height or width: any (policy.height and policy.width are unused)."""
        return 1

    @classmethod
    def duration_problem(cls, configs: Configs, seconds: float) -> str | None:
        """Above its duration embedder's `max_val` the conditioning would be clamped: refused."""
        most = (configs.get("duration_embedder") or {}).get("max_val", 384.0)
        if not 0 < seconds <= most:
            return (f"policy.duration={seconds}: {cls.pipeline} draws between 0 and {most} seconds (its duration "
                    "embedder's range)")
        return None

    def set_duration(self, seconds: float) -> None:
        if problem := self.duration_problem({"duration_embedder": dict(self.pipe.duration_embedder.config)}, seconds):
            raise ValueError(problem)
        self.duration = float(seconds)

    @property
    def sampling_rate(self) -> int:
        return int(self.pipe.vae.config.sampling_rate)

    def encode(self, prompts, guided):
        device, n = self.device, len(prompts)
        duration = self.pipe.encode_duration(self.duration, device, 1, n)
        out = {}
        for side, texts in (("pos", list(prompts)), ("neg", [""] * n if guided else None)):
            if texts is not None:
                embeds, mask = self.pipe.encode_prompt(texts, device, 1)
                embeds, mask = self.pipe.prepare_cross_attention(embeds, mask, duration)
                out.update({f"{side}/embeds": embeds.to(self.dtype), f"{side}/mask": mask,
                            f"{side}/duration": duration.to(self.dtype)})
        return out

    def _latent_length(self) -> int:
        """Latent frames of `duration` seconds: its samples rounded up to the VAE's downsampling."""
        return math.ceil(self.duration * self.sampling_rate / self.pipe.vae.downsampling_ratio)

    def noise(self, generator, height, width):
        shape = (1, self.pipe.vae.config.latent_dim, self._latent_length())
        return torch.randn(shape, generator=generator, dtype=torch.float32)

    def levels(self, num_steps, latent_shape):
        from diffusers.pipelines.stable_audio_3.pipeline_stable_audio_3 import logsnr_sigma_schedule
        sigmas = logsnr_sigma_schedule(num_steps, *self.logsnr_range)
        self.pipe.scheduler.set_timesteps(sigmas=sigmas, device="cpu")
        return self.pipe.scheduler.sigmas.tolist(), self.pipe.scheduler.timesteps.clone()

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)

        def run(h, c):
            return model(h.to(self.dtype), t.expand(h.shape[0]).to(h.device), encoder_hidden_states=c["embeds"],
                         global_hidden_states=c["duration"], encoder_attention_mask=c["mask"], return_dict=False)[0]
        return self._guided(run, x, pos, neg if guided else None, guidance_scale)

    def waveforms(self, latents: torch.Tensor) -> torch.Tensor:
        """The pipeline's output of latents [B, C, L]: the decoded audio [B, channels, S], cut to
        the duration's samples and clamped to [-1, 1]."""
        vae = self.pipe.vae
        audio = vae.decode(latents.to(vae.dtype)).sample
        return audio[:, :, :int(self.duration * self.sampling_rate)].clamp(-1.0, 1.0)

    def decode(self, latents, height, width):
        return [{"array": a.float().mean(0).cpu().numpy(), "sampling_rate": self.sampling_rate}
                for a in self.waveforms(latents)]

    def image_latents(self, pixels):
        raise ValueError(f"{type(self.pipe).__name__} draws sound: the supervised warm start encodes images")
