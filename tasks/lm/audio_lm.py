"""Audio language models as policies: Qwen2-Audio, the Qwen2.5-Omni thinker, any model whose
processor takes `audio`. Clips come from the data set's `audio_column` (one or a list per row): a
path read with `soundfile`, or {"array": samples, "sampling_rate": hz}; they are mixed to mono
and resampled with `soxr` to the feature extractor's rate."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmrl.data import RowError
from mmrl.registry import ADAPTERS

from ..model_loading import DTYPES, pretrained
from .audio_memory_formula import AudioLanguageMemory, audio_language_memory
from .causal_lm import CausalLMConfig
from .multimodal import MultimodalPolicy, column_values


@dataclass
class AudioLMConfig(CausalLMConfig):
    audio_column: str = field(default="audio", metadata={"help": (
        "The data-set column holding each prompt's audio (a path, or {array, sampling_rate}).")})


def load_audio(clip: Any, rate: int) -> np.ndarray:
    """Mono float32 samples at `rate` Hz from a path or {"array", "sampling_rate"}; a file that
    cannot be read fails naming its path."""
    import soxr
    if _is_file_dict(clip):  # a Hugging Face audio value
        clip = io.BytesIO(clip["bytes"]) if clip.get("bytes") else clip["path"]
    if isinstance(clip, (str, Path, io.BytesIO)):
        import soundfile
        try:
            samples, source_rate = soundfile.read(clip if isinstance(clip, io.BytesIO) else str(clip),
                                                  dtype="float32", always_2d=True)
        except (RuntimeError, OSError, soundfile.LibsndfileError) as e:
            raise ValueError(f"audio {str(clip)!r} cannot be read: {e}") from e
        samples = samples.mean(axis=1)
    elif isinstance(clip, dict) and "array" in clip and "sampling_rate" in clip:
        samples, source_rate = np.asarray(clip["array"], dtype=np.float32), int(clip["sampling_rate"])
        if samples.ndim == 2:
            samples = samples.mean(axis=0 if samples.shape[0] < samples.shape[1] else 1)
    else:
        raise TypeError("an audio clip must be a path, {'bytes', 'path'} or {'array': samples, 'sampling_rate': hz}, "
                        f"got {type(clip).__name__}")
    if samples.size == 0 or not np.isfinite(samples).all():
        raise ValueError(f"audio {clip if isinstance(clip, (str, Path)) else 'array'!s} is empty or not finite")
    return samples if source_rate == rate else soxr.resample(samples, source_rate, rate).astype(np.float32)


def _is_file_dict(clip: Any) -> bool:
    return isinstance(clip, dict) and "array" not in clip and bool(clip.get("bytes") or clip.get("path"))


def check_audio(value: Any) -> None:
    """Raise `RowError` unless every clip of a column value (one or a list) is a readable sound
    file (its header: `soundfile.info`) or a non-empty {"array", "sampling_rate"}."""
    import soundfile
    for clip in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(clip, dict) and "array" in clip:
            if "sampling_rate" not in clip or np.asarray(clip["array"]).size == 0:
                raise RowError(None, "audio array is empty or has no sampling_rate")
            continue
        if not (isinstance(clip, (str, Path)) or _is_file_dict(clip)):
            raise RowError(None, "not an audio clip", type(clip).__name__)
        source = clip if isinstance(clip, (str, Path)) else (
            io.BytesIO(clip["bytes"]) if clip.get("bytes") else clip["path"])
        if isinstance(source, (str, Path)) and not Path(source).is_file():
            raise RowError(None, "audio file does not exist", str(source))
        name = str(source) if isinstance(source, (str, Path)) else "<bytes>"
        try:
            info = soundfile.info(source if isinstance(source, io.BytesIO) else str(source))
        except Exception as e:
            raise RowError(None, "audio cannot be read", f"{name}: {e}") from None
        if info.frames == 0:
            raise RowError(None, "audio file has no samples", name)


def model_class(cfg: AudioLMConfig, config: Any) -> tuple[type, Any]:
    """(the transformers model class, its configuration) of a checkpoint's configuration: the class
    it names (`architectures[0]`) with its own configuration; of an Omni checkpoint (a config with a
    `thinker_config`: Qwen2.5-Omni, Qwen3-Omni), the thinker alone, the part that reads the media and
    writes text."""
    import transformers
    if getattr(config, "thinker_config", None) is not None:
        config = config.thinker_config
        architecture = type(config).__name__.removesuffix("Config") + "ForConditionalGeneration"
    else:
        architecture = (config.architectures or [None])[0]
    if architecture is None or not hasattr(transformers, architecture):
        raise ValueError(f"policy.model={cfg.model!r}: its config names no transformers model class "
                         f"({architecture!r})")
    return getattr(transformers, architecture), config


@ADAPTERS.register("audio_lm")
class AudioLMPolicy(MultimodalPolicy):
    Config = AudioLMConfig

    @classmethod
    def media_columns(cls, cfg: AudioLMConfig) -> dict[str, Any]:
        return {cfg.audio_column: check_audio}

    @classmethod
    def memory_model(cls, cfg: AudioLMConfig, prompt_length: int) -> AudioLanguageMemory:
        """Qwen2-Audio (tasks/lm/audio_memory_formula.py): one clip per prompt over the encoder's whole
        window; other audio encoders are refused by name."""
        return audio_language_memory(cfg, prompt_length, lambda config: model_class(cfg, config))

    def _load_pretrained(self, cfg: AudioLMConfig) -> None:
        """The processor, and the model `model_class` picks for the checkpoint's configuration."""
        from transformers import AutoConfig, AutoProcessor
        self.processor = AutoProcessor.from_pretrained(cfg.tokenizer or cfg.model,
                                                       trust_remote_code=cfg.trust_remote_code)
        build, config = model_class(cfg, AutoConfig.from_pretrained(cfg.model, trust_remote_code=cfg.trust_remote_code))
        self.model = pretrained(build, cfg.model, config=config, dtype=DTYPES[cfg.dtype],
                                attn_implementation=cfg.attn_implementation, trust_remote_code=cfg.trust_remote_code)

    def _media(self, row: Any) -> tuple[list[dict], dict[str, Any]]:
        rate = self.processor.feature_extractor.sampling_rate
        clips = [load_audio(c, rate) for c in column_values(row, self.cfg.audio_column)]
        media = {"audio": clips, "sampling_rate": rate} if clips else {}
        return [{"type": "audio"} for _ in clips], media
