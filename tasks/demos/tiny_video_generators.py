"""Tiny random video pipelines of 2026's generators, assembled in memory from configs (tests, CPU
recipes; no download): Wan 2.2 A14B's text-to-video pipeline with its two experts."""

from __future__ import annotations

import torch

from ..model_loading import TINY_MODELS
from .tiny_pipelines import _umt5, _wan_transformer, _wan_vae, pipeline_tokenizer

# Wan 2.2 T2V-A14B's switch: the high-noise expert denoises timesteps >= 0.875 * 1000 (its
# model_index.json; the I2V-A14B checkpoint's is 0.9)
WAN22_A14B_BOUNDARY = 0.875


@TINY_MODELS.register("wan22-a14b")
def tiny_wan22_a14b(seed: int = 0, layers: int = 1, boundary_ratio: float = WAN22_A14B_BOUNDARY):
    """A WanPipeline as Wan 2.2 T2V-A14B is one: a UMT5 encoder, two `layers`-layer Wan video
    transformers of the same shape drawn apart (`transformer`, the high-noise expert, and
    `transformer_2`, the low-noise one) switched at `boundary_ratio` * 1000, the Wan VAE (4x time,
    4x space), the flow-matching Euler scheduler with Wan's shift 3 (3 steps: one high-noise step,
    two low-noise ones)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tok = pipeline_tokenizer()
        return WanPipeline(tokenizer=tok, text_encoder=_umt5(tok), vae=_wan_vae(),
                           transformer=_wan_transformer(4, layers), transformer_2=_wan_transformer(4, layers),
                           scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), boundary_ratio=boundary_ratio)
