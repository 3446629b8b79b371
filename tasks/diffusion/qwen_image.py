"""The Qwen-Image family (`QwenImagePipeline`, Qwen-Image and Qwen-Image-2512): an MMDiT over a
Qwen2.5-VL text encoder's last hidden states, flow matching on 2x2-packed latents of a Wan-style
VAE (5-D, one frame), the Euler flow scheduler shifted by resolution, and "true CFG": two forwards
(prompt and negative prompt) combined as u + g (c - u), then rescaled token by token to the norm
of the conditional prediction, as the stock pipeline does. The prompt embeddings are padded with
masked positions to `text_length` tokens so that rollouts drawn apart can be joined."""

from __future__ import annotations

import torch
from torch import Tensor

from .families import PackedFlowLatents
from .family import FAMILIES, Configs, Family, split_cond


@FAMILIES.register("qwen_image")
class QwenImage(PackedFlowLatents, Family):
    pipeline = "QwenImagePipeline"
    batched_guidance = False  # the pipeline's two forwards: the prompt and the negative prompt differ in length
    text_length = 512  # the stock pipeline's default max_sequence_length (prompts are cut there)

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """The VAE halves each side once per entry of `temperal_downsample`; latents are packed 2x2."""
        vae = configs.get("vae") or {}
        return 2 ** len(vae.get("temperal_downsample", (False, True, True))) * 2

    def encode(self, prompts, guided):
        out = {}
        for side, texts in (("pos", prompts), ("neg", [""] * len(prompts) if guided else None)):
            if texts is not None:
                out[f"{side}/embeds"], out[f"{side}/mask"] = self._text(texts)
        return out

    def _text(self, texts: list[str], length: int | None = None, **inputs) -> tuple[Tensor, Tensor]:
        """(embeddings [B, L, D], mask [B, L]) of `texts` (with the pipeline's other `encode_prompt`
        inputs): the pipeline's, zero-padded to L = `length` (`text_length` unless given)."""
        length = length or self.text_length
        embeds, mask = self.pipe.encode_prompt(texts, device=self.device, max_sequence_length=self.text_length,
                                               **inputs)
        if embeds.shape[1] > length:
            raise ValueError(f"{type(self).__name__}: a prompt takes {embeds.shape[1]} text-encoder positions, "
                             f"more than the {length} its conditioning is padded to")
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        pad = length - embeds.shape[1]
        return (torch.nn.functional.pad(embeds, (0, 0, 0, pad)).to(self.dtype),
                torch.nn.functional.pad(mask, (0, pad)).to(torch.long))

    def noise(self, generator, height, width):
        h, w = self._latent_hw(height, width)
        c = self.denoiser.config.in_channels // 4
        x = torch.randn((1, 1, c, h, w), generator=generator, dtype=torch.float32)
        return self.pipe._pack_latents(x, 1, c, h, w)

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)
        n = x.shape[0]
        hidden, shapes = self._image_tokens(x, pos)
        timestep = t.expand(n).to(x.device, self.dtype) / 1000

        def run(c):
            return model(hidden_states=hidden.to(self.dtype), timestep=timestep, encoder_hidden_states=c["embeds"],
                         encoder_hidden_states_mask=c["mask"], img_shapes=[shapes] * n,
                         return_dict=False)[0][:, :x.shape[1]]
        text = run(pos)
        if not guided:
            return text
        uncond = run(neg)
        guided_pred = uncond + guidance_scale * (text - uncond)
        # the pipeline's rescale: each token's guided prediction takes the conditional one's norm
        return guided_pred * (text.norm(dim=-1, keepdim=True) / guided_pred.norm(dim=-1, keepdim=True))

    def _image_tokens(self, x: Tensor, pos: dict) -> tuple[Tensor, list[tuple[int, int, int]]]:
        """The transformer's image tokens [N, L, C] and their (frames, rows, columns) grids: the noisy
        latents' alone (an editing family appends its source image's)."""
        h, w = self._latent_hw(*self.size)
        return x, [(1, h // 2, w // 2)]

    def decode(self, latents, height, width):
        vae = self.pipe.vae
        z = self.pipe._unpack_latents(latents, height, width, self.pipe.vae_scale_factor).to(vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(z.device, z.dtype)
        std = torch.tensor(vae.config.latents_std).view(shape).to(z.device, z.dtype)
        image = vae.decode(z * std + mean, return_dict=False)[0][:, :, 0]
        return self.pipe.image_processor.postprocess(image, output_type="pil")

    def image_latents(self, pixels):
        vae = self.pipe.vae
        z = vae.encode(pixels.to(vae.device, vae.dtype).unsqueeze(2)).latent_dist.mean
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(z.device, z.dtype)
        std = torch.tensor(vae.config.latents_std).view(shape).to(z.device, z.dtype)
        z = ((z - mean) / std).float()
        return self.pipe._pack_latents(z, z.shape[0], z.shape[1], z.shape[3], z.shape[4])
