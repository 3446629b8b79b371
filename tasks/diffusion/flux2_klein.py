"""The FLUX.2 [klein] family (`Flux2KleinPipeline`: Klein 4B / 9B and their undistilled base
models): a FLUX.2 MMDiT over a Qwen3 encoder's stacked intermediate hidden states (the prompt
padded to `text_length` tokens, unmasked, as the pipeline), flow matching on latents patchified
2x2, batch-normalised by the VAE's running statistics and packed to tokens with 4-D position ids,
the Euler flow scheduler shifted by FLUX.2's empirical mu (a function of the image tokens and the
step count). The base models take CFG as the pipeline's two forwards; the step-distilled ones
(`is_distilled`) none."""

from __future__ import annotations

import torch
from torch import Tensor

from .families import linear_sigma_levels
from .family import FAMILIES, Configs, Family, split_cond, vae_scale


@FAMILIES.register("flux2_klein")
class Flux2Klein(Family):
    pipeline = "Flux2KleinPipeline"
    batched_guidance = False  # the pipeline's two forwards: prompt, then the empty negative prompt
    text_length = 512  # the pipeline's max_sequence_length: the tokenizer pads and cuts there
    text_layers = (9, 18, 27)  # the Qwen3 hidden states the pipeline stacks (`text_encoder_out_layers`)

    def __init__(self, pipe, size, num_frames=1):
        super().__init__(pipe, size, num_frames)
        if pipe.scheduler.config.get("use_flow_sigmas", False):
            raise ValueError(f"{type(pipe.scheduler).__name__} with use_flow_sigmas: the scheduler's own sigmas "
                             "replace the pipeline's; not supported")

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """The VAE's downsampling times its 2x2 patchify (the transformer's own patch is 1)."""
        return vae_scale(configs) * 2

    def encode(self, prompts, guided):
        if guided and self.pipe.config.get("is_distilled", False):
            raise ValueError("this FLUX.2 [klein] pipeline is step-distilled (is_distilled): it takes no CFG; set "
                             "policy.classifier_free_guidance=false")
        out = {"pos/embeds": self._text(list(prompts))}
        if guided:
            out["neg/embeds"] = self._text([""] * len(prompts))
        return out

    def _text(self, texts: list[str]) -> Tensor:
        embeds, _ = self.pipe.encode_prompt(texts, device=self.device, max_sequence_length=self.text_length,
                                            text_encoder_out_layers=self.text_layers)
        return embeds.to(self.dtype)

    def _token_hw(self, height: int, width: int) -> tuple[int, int]:
        """The latent tokens on a side: the VAE's latents, halved by the 2x2 patchify."""
        f = self.pipe.vae_scale_factor
        return height // (f * 2), width // (f * 2)

    def noise(self, generator, height, width):
        h, w = self._token_hw(height, width)
        x = torch.randn((1, self.denoiser.config.in_channels, h, w), generator=generator, dtype=torch.float32)
        return self.pipe._pack_latents(x)

    def levels(self, num_steps, latent_shape):
        from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu
        return linear_sigma_levels(self.pipe, num_steps, compute_empirical_mu(image_seq_len=latent_shape[-2],
                                                                              num_steps=num_steps))

    def _latent_ids(self, n: int, device: torch.device) -> Tensor:
        h, w = self._token_hw(*self.size)
        return self.pipe._prepare_latent_ids(torch.empty(n, 1, h, w)).to(device)

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)
        n = x.shape[0]
        img_ids = self._latent_ids(n, x.device)
        timestep = t.expand(n).to(x.device, self.dtype) / 1000

        def run(h, c):
            return model(hidden_states=h.to(self.dtype), timestep=timestep, guidance=None,
                         encoder_hidden_states=c["embeds"], txt_ids=self.pipe._prepare_text_ids(c["embeds"]).to(x.device),
                         img_ids=img_ids, return_dict=False)[0]
        return self._guided(run, x, pos, neg if guided else None, guidance_scale)

    def vae_latents(self, latents: Tensor) -> Tensor:
        """The VAE's latents [B, C, H, W] of packed tokens [B, L, 4C]: the pipeline's unpacking,
        batch-norm statistics restored, unpatchified (what the stock pipeline returns as "latent")."""
        vae = self.pipe.vae
        h, w = self._token_hw(*self.size)
        z = self.pipe._unpack_latents_with_ids(latents, self._latent_ids(len(latents), latents.device), h, w)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(z.device, z.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(z.device, z.dtype)
        return self.pipe._unpatchify_latents(z * std + mean)

    def decode(self, latents, height, width):
        image = self.pipe.vae.decode(self.vae_latents(latents).to(self.pipe.vae.dtype), return_dict=False)[0]
        return self.pipe.image_processor.postprocess(image, output_type="pil")

    def image_latents(self, pixels):
        z = self.pipe._encode_vae_image(pixels.to(self.pipe.vae.device, self.pipe.vae.dtype), generator=None)
        return self.pipe._pack_latents(z).float()
