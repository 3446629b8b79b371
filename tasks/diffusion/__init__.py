"""Diffusion and flow-matching text-to-image policies (SD3, FLUX.1, SD 1.5): samplers, the
trained-step schedule, the adapter, Chunk-GRPO chunks, TP-GRPO step rewards, tiny pipelines
(and the t2i demo's pixel-space flow pipeline and synthetic coloured shapes)."""

from . import policy, synthetic, tiny  # noqa: F401  (registration)
