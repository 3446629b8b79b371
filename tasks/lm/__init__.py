"""Language-model adapters, one unit per completion token: text (`causal_lm`, its rollouts in
`generation`), images and video (`vlm`), audio (`audio_lm`), their shared multimodal base, prefix
sharing, the colocated vLLM engine, and the token helpers `dlm` shares (chat prompts, rollout
batches, token log-probs)."""

from . import audio_lm, causal_lm, image_tools, python_tool, vlm  # noqa: F401  (registration)
