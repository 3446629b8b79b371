"""Diffusion and flow-matching text-to-image policies (SD3, FLUX.1, SD 1.5) and video policies
(Wan 2.1 / 2.2 text- and image-to-video, HunyuanVideo): samplers, the
trained-step schedule, pipeline loading, the adapter, Chunk-GRPO chunks, TP-GRPO step rewards.
(The tiny pipelines, the t2i demo's pixel-space flow pipelines and its synthetic coloured shapes
are the demos': `tasks.demos`.)"""

from . import families, policy, prompt_enhancer, video_families  # noqa: F401  (registration)
