"""The Z-Image family (`ZImagePipeline`: Z-Image and Z-Image-Turbo): a single-stream DiT that
reads a list of latents [C, 1, H, W] and a list of the Qwen3 encoder's unpadded prompt states,
flow matching on plain latents with the resolution-shifted Euler scheduler. The model predicts
x0 - noise, which the pipeline negates into the velocity; its timestep input is 1 - sigma. CFG
is Z-Image's own: pos + g (pos - neg) in one batched call (so `policy.guidance_scale` g is the
usual scale minus 1; Turbo samples with g = 0, no CFG); the pipeline's optional `cfg_normalization`
and `cfg_truncation` are off, as by default. The prompt states are kept zero-padded to
`text_length` tokens with their mask, and unpadded per row for each call."""

from __future__ import annotations

import torch
from torch import Tensor

from .families import flow_shift_mu, linear_sigma_levels
from .family import FAMILIES, Configs, Family, split_cond, vae_scale


@FAMILIES.register("z_image")
class ZImage(Family):
    pipeline = "ZImagePipeline"
    text_length = 512  # the pipeline's max_sequence_length: the tokenizer pads and cuts there

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """The VAE's downsampling times the DiT's patch (`all_patch_size`, 2)."""
        patch = (configs.get("transformer") or {}).get("all_patch_size") or (2,)
        return vae_scale(configs) * int(patch[0])

    def encode(self, prompts, guided):
        pos, neg = self.pipe.encode_prompt(list(prompts), device=self.device, do_classifier_free_guidance=guided,
                                           negative_prompt=[""] * len(prompts) if guided else None,
                                           max_sequence_length=self.text_length)
        out = {}
        for side, states in (("pos", pos), ("neg", neg if guided else None)):
            if states:
                out[f"{side}/embeds"], out[f"{side}/mask"] = self._padded(states)
        return out

    def _padded(self, states: list[Tensor]) -> tuple[Tensor, Tensor]:
        """[B, text_length, D] states zero-padded after each row's own, and their mask [B, text_length]."""
        embeds = torch.zeros(len(states), self.text_length, states[0].shape[-1], dtype=self.dtype, device=self.device)
        mask = torch.zeros(len(states), self.text_length, dtype=torch.bool, device=self.device)
        for i, s in enumerate(states):
            embeds[i, :len(s)], mask[i, :len(s)] = s.to(self.dtype), True
        return embeds, mask

    def noise(self, generator, height, width):
        f = self.pipe.vae_scale_factor
        h, w = 2 * (height // (f * 2)), 2 * (width // (f * 2))
        return torch.randn((1, self.denoiser.in_channels, h, w), generator=generator, dtype=torch.float32)

    def levels(self, num_steps, latent_shape):
        mu = flow_shift_mu(self.pipe, (latent_shape[-2] // 2) * (latent_shape[-1] // 2))
        return linear_sigma_levels(self.pipe, num_steps, mu)

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)
        n = x.shape[0]
        sides = [pos, neg] if guided else [pos]
        states = [e[m] for side in sides for e, m in zip(side["embeds"], side["mask"].bool())]
        latents = list(x.to(self.dtype).unsqueeze(2).repeat(len(sides), 1, 1, 1, 1).unbind(0))
        timestep = ((1000 - t.float()) / 1000).expand(n * len(sides)).to(x.device)
        out = torch.stack([o.float() for o in model(latents, timestep, states, return_dict=False)[0]]).squeeze(2)
        if guided:
            text, uncond = out[:n], out[n:]
            out = text + guidance_scale * (text - uncond)
        return -out  # the model predicts x0 - noise; the velocity is its negative

    def decode(self, latents, height, width):
        return self._vae_image(latents)
