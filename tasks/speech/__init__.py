"""Speech generators as policies over codec tokens: CSM (`csm`), one unit per codec frame, its
log-prob the chain rule over the frame's codebooks (`codec_frames`), its prompts with an optional
reference voice (`csm_prompts`); Dia (`dia`), one unit per delayed decoder step, its guided scores and
log-prob (`dia_steps`), its sampler (`dia_sampling`) and prompts (`dia_prompts`)."""

from . import csm, dia  # noqa: F401  (registration)
