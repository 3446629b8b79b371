"""Autoregressive image generators as policies, one unit per image token: Janus / Janus-Pro
(`task: janus`, `janus.py`) and Emu3 (`task: emu3`, `emu3.py`), their classifier-free guided
sampler and the unit log-probs (`guided_tokens.py`); Janus writing text through its language head
(`task: janus_text`, `janus_text.py`), the thinker of a unified composite."""

from . import emu3, janus  # noqa: F401  (registration)
from . import janus_text  # noqa: F401  (registration)
