"""Speaker similarity of a generated voice to a reference voice: the cosine of their speaker
embeddings (x-vectors of a speaker-verification model, `AutoModelForAudioXVector`: WavLM's
`WavLMForXVector`, microsoft/wavlm-base-plus-sv by default, as UniRL's TTS reward).

    speaker_similarity = clip((cos(e(completion), e(reference)) - floor) / (ceiling - floor), 0, 1)

with floor 0 and ceiling 1 by default (UniRL's `similarity_floor` / `similarity_ceiling`): the raw
cosine clipped at 0. Each clip is embedded alone (no padding beside a longer one), at the feature
extractor's rate (resampled with a polyphase filter when it differs). The reference is each row's
`speaker_audio` column (samples, {"array", "sampling_rate"} or a sound file path) or a precomputed
embedding in `speaker_embedding`; a row with neither scores None. Served like any reward
(`rewards.speaker_similarity.url`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from mmrl.core.scoring import register_reward

from .audio_models import load_audio_model, resample, waveform
from .outputs import AUDIO


def _load_speaker_model(name: str) -> tuple[Any, Any]:
    from transformers import AutoFeatureExtractor, AutoModelForAudioXVector
    return AutoFeatureExtractor.from_pretrained(name), AutoModelForAudioXVector.from_pretrained(name)


@torch.no_grad()
def xvector(processor: Any, model: Any, samples: np.ndarray, rate: int) -> torch.Tensor:
    """The L2-normalised fp32 x-vector [D] of one clip (resampled to the extractor's rate)."""
    target = int(processor.sampling_rate)
    inputs = processor(resample(samples, rate, target), sampling_rate=target, return_tensors="pt")
    param = next(model.parameters())
    inputs = {k: v.to(param.device) for k, v in inputs.items()}
    if "input_values" in inputs:
        inputs["input_values"] = inputs["input_values"].to(param.dtype)
    return torch.nn.functional.normalize(model(**inputs).embeddings[0].float(), dim=-1)


def _reference(processor, model, audio: Any, embedding: Any, i: int, rate: int | None) -> torch.Tensor | None:
    if embedding is not None:
        return torch.nn.functional.normalize(torch.as_tensor(embedding, dtype=torch.float32).reshape(-1), dim=-1)
    if audio is None:
        return None
    return xvector(processor, model, *waveform("speaker_similarity", audio, i, rate, "speaker_audio"))


@register_reward("speaker_similarity", outputs=AUDIO)
def speaker_similarity(prompts, completions, speaker_audio: Sequence[Any] | None = None,
                       speaker_embedding: Sequence[Any] | None = None, model: str = "microsoft/wavlm-base-plus-sv",
                       sampling_rate: int | None = None, floor: float = 0.0, ceiling: float = 1.0,
                       device: Any = None, **kwargs) -> list[float | None]:
    """clip((cos - floor) / (ceiling - floor), 0, 1) of each audio completion's x-vector with its
    row's reference voice (module docstring); None where the row has no reference."""
    if ceiling <= floor:
        raise ValueError(f"speaker_similarity: ceiling={ceiling} must be above floor={floor}")
    audio = list(speaker_audio) if speaker_audio is not None else [None] * len(completions)
    embeds = list(speaker_embedding) if speaker_embedding is not None else [None] * len(completions)
    if len(audio) != len(completions) or len(embeds) != len(completions):
        raise ValueError(f"speaker_similarity: the reference columns have {len(audio)} / {len(embeds)} values "
                         f"for {len(completions)} completions")
    processor, encoder = load_audio_model("speaker", model, device, _load_speaker_model)
    out: list[float | None] = []
    for i, completion in enumerate(completions):
        reference = _reference(processor, encoder, audio[i], embeds[i], i, sampling_rate)
        if reference is None:
            out.append(None)
            continue
        generated = xvector(processor, encoder, *waveform("speaker_similarity", completion, i, sampling_rate))
        if generated.numel() != reference.numel():
            raise ValueError(f"speaker_similarity: row {i}: the reference embedding has {reference.numel()} "
                             f"dimensions, the model's {generated.numel()}")
        cosine = float(torch.dot(generated, reference.to(generated.device)).clamp(-1.0, 1.0))
        out.append(min(max((cosine - floor) / (ceiling - floor), 0.0), 1.0))
    return out
