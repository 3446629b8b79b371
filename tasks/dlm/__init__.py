"""Masked diffusion language models (LLaDA-style): block decoding, log-prob estimators, policy."""

from . import estimators, generation, policy  # noqa: F401  (registration)
