"""Autoregressive image generators as policies, one unit per image token: Janus / Janus-Pro
(`task: janus`, `janus.py`), its classifier-free guided sampler and the unit log-probs
(`guided_tokens.py`)."""

from . import janus  # noqa: F401  (registration)
