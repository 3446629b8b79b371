"""Speech generators as policies over codec tokens, on what they share as adapters (`speech_policy`:
audio out, the `ended` column, a reference voice's columns): CSM (`csm`), one unit per codec frame, its
log-prob the chain rule over the frame's codebooks (`codec_frames`), its prompts with an optional
reference voice (`csm_prompts`); Dia (`dia`), one unit per delayed decoder step, its guided scores and
log-prob (`dia_steps`), its sampler (`dia_sampling`) and prompts (`dia_prompts`); Qwen2.5-Omni's talker
(`omni_talker`), one unit per single-codebook codec token, fed the frozen thinker's states of the text
teacher-forced (`omni_talker_inputs`)."""

from . import csm, dia, omni_talker  # noqa: F401  (registration)
