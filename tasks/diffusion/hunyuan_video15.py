"""The HunyuanVideo 1.5 family (`HunyuanVideo15Pipeline`, text to video): a DiT over a Qwen2.5-VL
text model's hidden states (past its system prompt) and ByT5 embeddings of the prompt's quoted
glyph text, reading the noisy latents concatenated with zero condition latents and a zero mask
(the image-to-video inputs, empty in text to video) and zero image embeddings; the Euler flow
scheduler on sigmas linspace(1, 0) shifted; classifier-free guidance as the stock pipeline's
guider does it: two forwards (the prompt and the empty negative prompt), u + g (c - u), g =
`policy.guidance_scale` (the stock pipeline keeps its scale in `pipe.guider`)."""

from __future__ import annotations

import torch
from torch import Tensor

from .family import FAMILIES, Configs, patch_size, split_cond
from .video_families import HunyuanVideo, VideoFamily


@FAMILIES.register("hunyuan_video15")
class HunyuanVideo15(VideoFamily):
    pipeline = "HunyuanVideo15Pipeline"
    fps = 24  # HunyuanVideo 1.5's frame rate (the authors' and diffusers' examples)
    levels = HunyuanVideo.levels  # sigmas linspace(1, 0) through the shifted scheduler, as the stock call

    @classmethod
    def size_multiple(cls, configs: Configs) -> int:
        """The VAE's `spatial_compression_ratio` (16 unless its config says) times the patch size."""
        return (configs.get("vae") or {}).get("spatial_compression_ratio", 16) * patch_size(configs)

    def _noise_channels(self) -> int:
        return self.pipe.num_channels_latents

    def encode(self, prompts, guided):
        out = {}
        for side, texts in (("pos", prompts), ("neg", [""] * len(prompts) if guided else None)):
            if texts is not None:
                embeds, mask, glyphs, glyph_mask = self.pipe.encode_prompt(prompt=list(texts), device=self.device,
                                                                           dtype=self.dtype, batch_size=len(texts))
                out.update({f"{side}/embeds": embeds, f"{side}/mask": mask, f"{side}/glyphs": glyphs,
                            f"{side}/glyph_mask": glyph_mask})
        return out

    def predict(self, model, x, t, cond, guidance_scale, guided):
        pos, neg = split_cond(cond)
        n = x.shape[0]
        pipe = self.pipe
        # text to video: zero condition latents [n, C, F, H, W], a zero mask [n, 1, F, H, W], zero image embeddings
        hidden = torch.cat([x, torch.zeros_like(x), torch.zeros_like(x[:, :1])], dim=1).to(self.dtype)
        image = torch.zeros(n, pipe.vision_num_semantic_tokens, pipe.vision_states_dim, dtype=self.dtype,
                            device=x.device)
        timestep = t.expand(n).to(x.device, self.dtype)

        def run(h: Tensor, c: dict) -> Tensor:
            return model(hidden_states=hidden, image_embeds=image, timestep=timestep, encoder_hidden_states=c["embeds"],
                         encoder_attention_mask=c["mask"], encoder_hidden_states_2=c["glyphs"],
                         encoder_attention_mask_2=c["glyph_mask"], return_dict=False)[0]
        return self._guided(run, x, pos, neg if guided else None, guidance_scale)

    def decode(self, latents, height, width):
        """One video per VAE call: the VAE's causal attention mask is built for a batch of one (diffusers 0.42)."""
        vae = self.pipe.vae
        return [frames for z in latents.split(1)
                for frames in self._frames(vae.decode(z.to(vae.dtype) / vae.config.scaling_factor, return_dict=False)[0])]
