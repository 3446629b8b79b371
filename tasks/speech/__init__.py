"""Speech generators as policies over codec tokens: CSM (`csm`), one unit per codec frame, its
log-prob the chain rule over the frame's codebooks (`codec_frames`), its prompts with an optional
reference voice (`csm_prompts`)."""

from . import csm  # noqa: F401  (registration)
