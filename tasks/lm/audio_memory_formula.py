"""The memory formula of an audio language model (the audio_lm adapter's `memory_model`;
docs/memory-plan.md): the causal LM's (tasks/lm/memory_formula.py) over a sequence that also holds
the clip's audio tokens, plus the audio encoder's activations, for Qwen2-Audio's Whisper-style
encoder. From the model's configuration alone (no weights):

- the clip: one per prompt, the encoder's whole window: its mel input is always padded to
  `2 x max_source_positions` frames (30 s for Qwen2-Audio), so the encoder runs over `frames =
  max_source_positions` positions whatever the clip's length; a clip filling the window gives
  `(frames - 2) // 2 + 1` audio tokens (750 at 30 s), the most, which join each row's prompt in the
  decoder (activations, KV cache);
- the encoder's activations a training forward keeps, per position of every row's window, in the
  weights' dtype (read off the tensors autograd saves in the encoder's forward under SDPA attention
  at widths 32 and 64, 1 to 3 layers, two feed-forward widths, 1 to 4 heads and 100 to 300
  positions; exactly linear in each): the mel input and the two convolutions' (2 x mel bins +
  `OUTSIDE_PER_HIDDEN` x width + 1, the pooled output's norm among them); per layer
  `LAYER_PER_HIDDEN` x width (the two LayerNorms' inputs and outputs, the queries, keys, values and
  attention output, the output projection's input, the residual) + 2 x feed-forward width (fc1's
  output and GELU's) + heads (the attention's log-sum-exp) + `LAYER_CONSTANT` (the norms'
  statistics) + `frames` (the padding mask, made a float [frames, frames] per layer: a clip shorter
  than the window; one that fills it has no mask, and the plan is above by that much). With
  activation checkpointing: each layer's input, what lies outside the layers and the boolean mask;
  the layer the backward recomputes runs after the decoder's backward has freed the decoder's
  activations, so it is not at the peak;
- beside the update, the processor's fp32 mel features (and their frame mask) the step's rollouts
  hold: one clip per prompt of the step (a group's rows share their prompt's tensor).
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from mmrl.errors import UserError

from ..model_loading import DTYPES, load_tiny, model_configuration, pretrained, weightless
from .memory_formula import DecoderMemory, config_field, planned_settings

ENCODERS = ("qwen2_audio_encoder",)  # the audio encoders modelled (their config's model_type)
LAYER_PER_HIDDEN = 9  # elements per position and encoder layer, x its width (module docstring)
LAYER_CONSTANT = 4  # the two LayerNorms' mean and inverse std per position
OUTSIDE_PER_HIDDEN = 7  # the convolutions' outputs and GELUs, the positions' sum, the pooling, its norm, the projection's input


class AudioLanguageMemory(DecoderMemory):
    """A Qwen2-Audio-style model's memory: one clip per prompt over the encoder's whole window of
    `frames` positions (`mel_bins` x 2 x `frames` mel features), `audio_tokens` of them in the decoder."""

    family = "audio language model (decoder with a Whisper-style audio encoder)"

    def __init__(self, module: nn.Module, cfg: Any, prompt_length: int):
        audio = module.config.audio_config
        if audio.model_type not in ENCODERS:
            raise UserError(f"mmrl plan: the audio encoder {audio.model_type!r} of {cfg.model} has no memory formula "
                            f"(modelled: {', '.join(ENCODERS)}); its memory is not planned")
        self.frames = config_field(audio, "max_source_positions")
        self.audio_tokens = (self.frames - 2) // 2 + 1
        super().__init__(module, cfg.gradient_checkpointing, prompt_length + self.audio_tokens, cfg.max_new_tokens,
                         cfg.logprob_chunk_tokens, cfg.logprob_chunk_rows, cfg.logprob_check)
        self.mel_bins = config_field(audio, "num_mel_bins")
        self.audio_hidden = config_field(audio, "d_model")
        self.audio_ffn = config_field(audio, "encoder_ffn_dim")
        self.audio_heads = config_field(audio, "encoder_attention_heads")
        self.audio_layers = config_field(audio, "encoder_layers")

    def encoder_layer_elements(self) -> int:
        """One position's activations in one encoder layer."""
        return (LAYER_PER_HIDDEN * self.audio_hidden + 2 * self.audio_ffn + self.audio_heads + LAYER_CONSTANT
                + self.frames)

    def encoder_bytes(self, rows: int, checkpointing: bool) -> int:
        """The audio encoder's activations for `rows` rows' clips."""
        outside = 2 * self.mel_bins + OUTSIDE_PER_HIDDEN * self.audio_hidden + 1
        if checkpointing:  # each layer's input, and the boolean mask once (bytes, not elements)
            return rows * self.frames * ((self.audio_layers * self.audio_hidden + outside) * self.bytes + self.frames)
        return rows * self.frames * (self.audio_layers * self.encoder_layer_elements() + outside) * self.bytes

    def activation_bytes(self, rows: int, checkpointing: bool) -> int:
        return super().activation_bytes(rows, checkpointing) + self.encoder_bytes(rows, checkpointing)

    def update_bytes(self, rows: int, prompts: int, trains_head: bool) -> dict[str, int]:
        return {**super().update_bytes(rows, prompts, trains_head), "rollouts' mel features": self.feature_bytes(prompts)}

    def first_step_bytes(self, rows: int, prompts: int) -> dict[str, int]:
        passes = super().first_step_bytes(rows, prompts)
        return {**passes, "rollouts' mel features": self.feature_bytes(prompts)} if passes else passes

    def feature_bytes(self, prompts: int) -> int:
        """The processor's features the step's rollouts hold beside a pass: one window per prompt
        (fp32 mel features, an int32 mask entry per mel frame)."""
        return prompts * 2 * self.frames * (self.mel_bins * 4 + 4)


def audio_language_memory(cfg: Any, prompt_length: int,
                          model_class: Callable[[Any], tuple[type, Any]]) -> AudioLanguageMemory:
    """The formula over the weightless build of `cfg`'s model (`model_class`: the class and the
    configuration the adapter builds from a checkpoint's configuration); settings it does not model
    (an attention other than SDPA, an Omni thinker's encoder) are refused by name."""
    planned_settings(cfg)
    if cfg.attn_implementation not in (None, "sdpa"):
        raise UserError(f"mmrl plan: policy.attn_implementation={cfg.attn_implementation!r} is not planned (the audio "
                        "encoder's activations were read under sdpa, the default)")
    with weightless():
        if cfg.model.startswith("tiny:"):
            module = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)[0]
        else:
            build, config = model_class(model_configuration(cfg.model, cfg.trust_remote_code))
            module = pretrained(build, cfg.model, config=config, dtype=DTYPES[cfg.dtype],
                                trust_remote_code=cfg.trust_remote_code)
    if getattr(module.config, "audio_config", None) is None:
        raise UserError(f"mmrl plan: {cfg.model} ({type(module).__name__}) has no audio encoder configuration "
                        "(audio_config); its memory is not planned")
    return AudioLanguageMemory(module, cfg, prompt_length)
