"""Diffusion and flow-matching text-to-image policies (SD3, FLUX.1, SD 1.5): samplers, the
trained-step schedule, the adapter, tiny pipelines."""

from . import pixel, policy, synthetic, tiny  # noqa: F401  (registration)
