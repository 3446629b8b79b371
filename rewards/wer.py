"""Transcript rewards: word and character error rate against the `reference` column.

``wer`` and ``cer`` score text completions; ``asr_wer`` scores audio completions (waveforms) by
transcribing them with a Whisper model first. By default all three give
``1 - min(error rate, 1)``, so a perfect transcript scores 1 and one with at least as many errors
as reference words scores 0; ``mode`` picks the GRPO-for-ASR paper's variants instead:
``negative`` (-error rate, unclipped, so a hallucination of WER 3.17 scores below one of 1.67),
``exact_match`` (1 when the normalised transcripts are equal, else 0) and ``errors``
(-(S + D + I), the total edit count).

The error rates themselves (transcript normalisation, jiwer's alignments) are in `error_rates.py`.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Sequence, get_args

import numpy as np

from mmrl.core.scoring import register_reward

from .audio_models import resample, waveform
from .error_rates import edit_counts, error_rates
from .outputs import AUDIO, TEXT
from .text import completion_text

Mode = Literal["one_minus_clipped", "negative", "exact_match", "errors"]
MODES = get_args(Mode)


def _score(name: str, unit: str, hypotheses: Sequence[str], reference: Sequence[Any],
           norm: dict, mode: str = "one_minus_clipped") -> list[float | None]:
    if mode not in MODES:
        raise ValueError(f"{name}: mode={mode!r} is not one of {', '.join(MODES)}")
    for i, ref in enumerate(reference):
        if ref is not None and not isinstance(ref, str):
            raise ValueError(f"{name}: reference[{i}]={ref!r:.80} is not a string")
    rows = [i for i, ref in enumerate(reference) if ref is not None]
    refs, hyps = [reference[i] for i in rows], [hypotheses[i] for i in rows]
    out: list[float | None] = [None] * len(reference)
    if mode == "one_minus_clipped":
        for i, rate in zip(rows, error_rates(refs, hyps, unit, **norm)):
            out[i] = 1.0 - min(rate, 1.0)
        return out
    for i, (errors, n) in zip(rows, edit_counts(refs, hyps, unit, **norm)):
        if mode == "negative":  # an empty reference: 0 for an empty hypothesis, else -1 (capped as in error_rates)
            out[i] = -(errors / n) if n else -min(float(errors), 1.0)
        elif mode == "exact_match":
            out[i] = 1.0 if errors == 0 else 0.0
        else:
            out[i] = -float(errors)
    return out


def _check_lengths(name: str, completions: Sequence[Any], reference: Sequence[Any]) -> None:
    if reference is None or isinstance(reference, str):
        raise ValueError(f"{name}: column 'reference' must be a list of transcripts, got {reference!r:.80}")
    if len(reference) != len(completions):
        raise ValueError(f"{name}: column 'reference' has {len(reference)} values for "
                         f"{len(completions)} completions")


@register_reward("wer", outputs=TEXT)
def wer_reward(prompts, completions, reference, lowercase: bool = True, strip_punctuation: bool = True,
               numbers_to_words: bool = False, mode: Mode = "one_minus_clipped", **kwargs) -> list[float | None]:
    """1 - min(WER, 1) of each completion's text against `reference`; None where the reference
    is None. Completions are strings or chat-message lists. `mode`: ``one_minus_clipped``
    (default), ``negative`` (-WER), ``exact_match``, ``errors`` (-(S + D + I)); see the module."""
    _check_lengths("wer", completions, reference)
    norm = dict(lowercase=lowercase, strip_punctuation=strip_punctuation, numbers_to_words=numbers_to_words)
    return _score("wer", "word", [completion_text(c) for c in completions], reference, norm, mode)


@register_reward("cer", outputs=TEXT)
def cer_reward(prompts, completions, reference, lowercase: bool = True, strip_punctuation: bool = True,
               numbers_to_words: bool = False, mode: Mode = "one_minus_clipped", **kwargs) -> list[float | None]:
    """1 - min(CER, 1) of each completion's text against `reference`; None where the reference
    is None. `mode` as for `wer`, over characters."""
    _check_lengths("cer", completions, reference)
    norm = dict(lowercase=lowercase, strip_punctuation=strip_punctuation, numbers_to_words=numbers_to_words)
    return _score("cer", "char", [completion_text(c) for c in completions], reference, norm, mode)


# -- audio completions: Whisper transcription ---------------------------------------------------

_ASR_MODELS: dict[tuple[str, str | None], tuple[Any, Any]] = {}  # (name, device) -> (processor, model)
_REGISTERED: dict[str, tuple[Any, Any]] = {}
_TRANSCRIBERS: dict[str, tuple[Callable[[list[np.ndarray]], list[str]], int]] = {}


def register_transcriber(name: str, transcribe_fn: Callable[[list[np.ndarray]], list[str]], sampling_rate: int) -> None:
    """Make an ASR model that is not a Whisper available as ``model=name``: `transcribe_fn` maps 1-D
    float32 waveforms at `sampling_rate` to their transcripts (e.g. a demo's tiny judge, in process)."""
    _TRANSCRIBERS[name] = (transcribe_fn, sampling_rate)


def register_asr_model(name: str, processor: Any, model: Any) -> None:
    """Make an already-built Whisper ``(processor, model)`` pair available as ``model=name``
    (no download; e.g. a tiny random model in tests). It is used on whatever device it is on
    unless the reward is given ``device``."""
    _REGISTERED[name] = (processor, model)


def _resolve_device(device: Any) -> str:
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def load_asr_model(name: str, device: Any = None) -> tuple[Any, Any]:
    """The Whisper (processor, model) for `name` (a hub id or a local directory) on `device`
    (default: cuda when available, else cpu), loaded once per (name, device) and cached; a pair
    from `register_asr_model` is returned as registered (moved to `device` when one is given)."""
    if name in _REGISTERED:
        processor, model = _REGISTERED[name]
        if device is not None:
            model.to(device)
        return processor, model
    key = (name, _resolve_device(device))
    if key not in _ASR_MODELS:
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        processor = WhisperProcessor.from_pretrained(name)
        model = WhisperForConditionalGeneration.from_pretrained(name).to(key[1]).eval()
        _ASR_MODELS[key] = (processor, model)
    return _ASR_MODELS[key]


def _waveform(completion: Any, i: int, sampling_rate: int | None) -> tuple[np.ndarray, int]:
    """(float32 1-D samples, rate) of one audio completion."""
    return waveform("asr_wer", completion, i, sampling_rate)


def transcribe(waveforms: Sequence[np.ndarray], processor: Any, model: Any, batch_size: int = 16,
               language: str | None = None, max_new_tokens: int | None = None) -> list[str]:
    """Greedy Whisper transcripts of 1-D waveforms already at the feature extractor's rate."""
    import torch

    rate = processor.feature_extractor.sampling_rate
    param = next(model.parameters())
    gen_kwargs: dict[str, Any] = {"do_sample": False, "num_beams": 1}
    if max_new_tokens is not None:
        gen_kwargs["max_new_tokens"] = max_new_tokens
    if language is not None:
        gen_kwargs.update(language=language, task="transcribe")
    out: list[str] = []
    with torch.no_grad():
        for start in range(0, len(waveforms), batch_size):
            batch = list(waveforms[start:start + batch_size])
            feats = processor.feature_extractor(batch, sampling_rate=rate, return_tensors="pt")
            ids = model.generate(feats.input_features.to(param.device, param.dtype), **gen_kwargs)
            out.extend(t.strip() for t in processor.batch_decode(ids, skip_special_tokens=True))
    return out


@register_reward("asr_wer", outputs=AUDIO)
def asr_wer_reward(prompts, completions, reference, model: str = "openai/whisper-tiny",
                   sampling_rate: int | None = None, batch_size: int = 16, language: str | None = None,
                   device: Any = None, max_new_tokens: int | None = None, lowercase: bool = True,
                   strip_punctuation: bool = True, numbers_to_words: bool = False, mode: Mode = "one_minus_clipped",
                   **kwargs) -> list[float | None]:
    """1 - min(WER, 1) of the Whisper transcript of each audio completion against `reference`
    (intelligibility, for a speech generator: the reference is the text it was asked to say).

    Completions are waveforms: 1-D float numpy arrays or torch tensors (rate from
    `sampling_rate`) or ``{"array": ..., "sampling_rate": ...}``; they are resampled to the
    feature extractor's rate (16 kHz) when theirs differs. `model` is a hub id, a local
    directory, a name given to `register_asr_model`, or one given to `register_transcriber` (an ASR
    model that is not a Whisper, which transcribes instead); it is loaded once per (model, device).
    Transcription is batched and greedy. None where the reference is None (those are not
    transcribed). `mode` as for `wer`.
    """
    _check_lengths("asr_wer", completions, reference)
    if mode not in MODES:
        raise ValueError(f"asr_wer: mode={mode!r} is not one of {', '.join(MODES)}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"asr_wer: batch_size={batch_size!r} must be a positive integer")
    waves = [_waveform(c, i, sampling_rate) for i, c in enumerate(completions)]
    todo = [i for i, ref in enumerate(reference) if ref is not None]
    hypotheses = [""] * len(completions)
    if todo and model in _TRANSCRIBERS:
        transcribe_fn, target = _TRANSCRIBERS[model]
        for i, text in zip(todo, transcribe_fn([resample(waves[i][0], waves[i][1], target) for i in todo])):
            hypotheses[i] = text
    elif todo:
        processor, asr = load_asr_model(model, device)
        target = processor.feature_extractor.sampling_rate
        batch = [resample(waves[i][0], waves[i][1], target) for i in todo]
        for i, text in zip(todo, transcribe(batch, processor, asr, batch_size, language, max_new_tokens)):
            hypotheses[i] = text
    norm = dict(lowercase=lowercase, strip_punctuation=strip_punctuation, numbers_to_words=numbers_to_words)
    return _score("asr_wer", "word", hypotheses, reference, norm, mode)
