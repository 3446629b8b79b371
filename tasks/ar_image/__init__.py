"""Autoregressive image generators as policies, one unit per image token: Janus / Janus-Pro
(`task: janus`, `janus.py`) and Emu3 (`task: emu3`, `emu3.py`), their classifier-free guided
sampler and the unit log-probs (`guided_tokens.py`)."""

from . import emu3, janus  # noqa: F401  (registration)
