"""Audio language models as policies: Qwen2-Audio, the Qwen2.5-Omni thinker, any model whose
processor takes `audio`. Clips come from the data set's `audio_column` (one or a list per row): a
path read with `soundfile`, or {"array": samples, "sampling_rate": hz}; they are mixed to mono
and resampled with `soxr` to the feature extractor's rate."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmrl.registry import ADAPTERS

from .causal_lm import DTYPES, CausalLMConfig
from .multimodal import MultimodalPolicy, column_values


@dataclass
class AudioLMConfig(CausalLMConfig):
    audio_column: str = field(default="audio", metadata={"help": (
        "The data-set column holding each prompt's audio (a path, or {array, sampling_rate}).")})


def load_audio(clip: Any, rate: int) -> np.ndarray:
    """Mono float32 samples at `rate` Hz from a path or {"array", "sampling_rate"}; a file that
    cannot be read fails naming its path."""
    import soxr
    if isinstance(clip, (str, Path)):
        import soundfile
        try:
            samples, source_rate = soundfile.read(str(clip), dtype="float32", always_2d=True)
        except (RuntimeError, OSError, soundfile.LibsndfileError) as e:
            raise ValueError(f"audio {str(clip)!r} cannot be read: {e}") from e
        samples = samples.mean(axis=1)
    elif isinstance(clip, dict) and "array" in clip and "sampling_rate" in clip:
        samples, source_rate = np.asarray(clip["array"], dtype=np.float32), int(clip["sampling_rate"])
        if samples.ndim == 2:
            samples = samples.mean(axis=0 if samples.shape[0] < samples.shape[1] else 1)
    else:
        raise TypeError("an audio clip must be a path or {'array': samples, 'sampling_rate': hz}, "
                        f"got {type(clip).__name__}")
    if samples.size == 0 or not np.isfinite(samples).all():
        raise ValueError(f"audio {clip if isinstance(clip, (str, Path)) else 'array'!s} is empty or not finite")
    return samples if source_rate == rate else soxr.resample(samples, source_rate, rate).astype(np.float32)


@ADAPTERS.register("audio_lm")
class AudioLMPolicy(MultimodalPolicy):
    Config = AudioLMConfig

    def _load_pretrained(self, cfg: AudioLMConfig) -> None:
        """The processor, and the model class its config names (`architectures[0]`)."""
        import transformers
        from transformers import AutoConfig, AutoProcessor
        self.processor = AutoProcessor.from_pretrained(cfg.tokenizer or cfg.model,
                                                       trust_remote_code=cfg.trust_remote_code)
        architecture = (AutoConfig.from_pretrained(cfg.model, trust_remote_code=cfg.trust_remote_code)
                        .architectures or [None])[0]
        if architecture is None or not hasattr(transformers, architecture):
            raise ValueError(f"policy.model={cfg.model!r}: its config names no transformers model class "
                             f"({architecture!r})")
        self.model = getattr(transformers, architecture).from_pretrained(
            cfg.model, dtype=DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation,
            trust_remote_code=cfg.trust_remote_code)

    def _media(self, row: Any) -> tuple[list[dict], dict[str, Any]]:
        rate = self.processor.feature_extractor.sampling_rate
        clips = [load_audio(c, rate) for c in column_values(row, self.cfg.audio_column)]
        media = {"audio": clips, "sampling_rate": rate} if clips else {}
        return [{"type": "audio"} for _ in clips], media
