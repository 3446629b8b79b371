"""What the speech policies share as adapters (`Policy` subclasses over codec tokens): completions are
waveforms, each rollout says whether it ended by itself (`ended`, for `tts_stability`), the rollout
worker runs them, and a reference voice, where the model takes one, comes from two data columns (a
clip and its transcript) that go together."""

from __future__ import annotations

from typing import Any

from mmrl.core.policy import Policy

from ..lm.audio_lm import check_audio

VOICE_COLUMNS_PROBLEM = ("policy.voice_audio_column and policy.voice_text_column go together (a reference voice is "
                         "a clip and its transcript)")


class SpeechPolicy(Policy):
    """A policy whose completions are speech: audio out, an `ended` column per rollout."""

    runs_in_rollout_worker = True  # its rollouts need the model alone, not a process group

    @classmethod
    def output_kind(cls, cfg: Any) -> str:
        return "audio"

    @classmethod
    def rollout_columns(cls, cfg: Any) -> tuple[str, ...]:
        """`ended`: whether each completion ended by itself (False: cut at its length limit)."""
        return ("ended",)


class ReferenceVoicePolicy(SpeechPolicy):
    """A speech policy that may take a reference voice: `cfg.voice_audio_column` (a path or
    {array, sampling_rate}) and `cfg.voice_text_column` (its transcript)."""

    @staticmethod
    def voice_columns_problem(cfg: Any) -> str | None:
        """Why the voice columns do not go together; None where they do."""
        return VOICE_COLUMNS_PROBLEM if (cfg.voice_audio_column is None) != (cfg.voice_text_column is None) else None

    @classmethod
    def media_columns(cls, cfg: Any) -> dict[str, Any]:
        return {cfg.voice_audio_column: check_audio} if cfg.voice_audio_column else {}

    @classmethod
    def required_columns(cls, cfg: Any) -> dict[str, str]:
        return {cfg.voice_text_column: "the reference voice's transcript"} if cfg.voice_text_column else {}
