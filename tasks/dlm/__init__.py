"""Masked diffusion language models (LLaDA-style): block decoding, log-prob estimators, policy."""

from . import bound_estimators, estimators, generation, policy, trajectory_estimators  # noqa: F401  (registration)
