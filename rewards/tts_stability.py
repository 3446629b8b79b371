"""Stability of generated speech: 1 when every gate of UniRL's TTS stability reward passes, else 0
(UniRL `unirl/reward/local/tts_stability.py`, its defaults). A completion fails when it is

    empty, or not finite;
    silent: RMS below `silence_rms` (1e-4);
    clipped: more than `max_clipping_fraction` (1%) of its samples at |x| >= `clipping_amplitude` (0.999);
    of an extreme duration: under `min_seconds` (0.2 s) or over `max_seconds` (60 s), or, where the row
        has an `expected_duration_s`, outside [0.25, 4] times it;
    repetitive: for some lag of 1..8 frames of 0.2 s (mean removed), more than 80% of the frames have a
        cosine above 0.995 with the frame that many before;
    unfinished: the rollout did not end by itself (the `ended` column a speech policy hands the rewards
        is False), when `require_eos`.

UniRL also gates on codec repetition statistics its rollout records (longest run, repetition and
unique-code fractions); mmrl's speech rollouts do not record them, so those gates are not applied."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mmrl.core.scoring import register_reward

from .audio_models import waveform
from .outputs import AUDIO


def repetition_fraction(samples: np.ndarray, rate: int, frame_seconds: float = 0.2, max_lag: int = 8,
                        threshold: float = 0.995) -> float:
    """The largest fraction, over lags 1..max_lag, of consecutive frames (mean removed) whose cosine with
    the frame `lag` before exceeds `threshold`; 0 for a clip of fewer than two frames."""
    frame = max(8, round(frame_seconds * rate))
    count = len(samples) // frame
    if count < 2:
        return 0.0
    frames = samples[:count * frame].reshape(count, frame).astype(np.float64)
    frames = frames - frames.mean(axis=1, keepdims=True)
    norms = np.maximum(np.linalg.norm(frames, axis=1), 1e-8)
    best = 0.0
    for lag in range(1, min(max_lag, count - 1) + 1):
        cosine = (frames[lag:] * frames[:-lag]).sum(axis=1) / (norms[lag:] * norms[:-lag])
        best = max(best, float((cosine > threshold).mean()))
    return best


def failed_gates(samples: np.ndarray, rate: int, expected: float | None, ended: bool | None, settings: dict) -> list[str]:
    """The names of the gates one completion fails (module docstring)."""
    failed = []
    if settings["require_eos"] and ended is not True:
        failed.append("missing_eos")
    if samples.size == 0:
        return failed + ["empty"]
    if not np.isfinite(samples).all():
        return failed + ["non_finite"]
    duration, rms = samples.size / rate, float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    if rms < settings["silence_rms"]:
        failed.append("silence")
    if float((np.abs(samples) >= settings["clipping_amplitude"]).mean()) > settings["max_clipping_fraction"]:
        failed.append("clipping")
    if repetition_fraction(samples, rate) > settings["max_repetition_fraction"]:
        failed.append("audio_repetition")
    extreme = not settings["min_seconds"] <= duration <= settings["max_seconds"]
    if expected is not None:
        extreme = extreme or expected <= 0 or not 0.25 <= duration / expected <= 4.0
    return failed + (["extreme_duration"] if extreme else [])


@register_reward("tts_stability", outputs=AUDIO)
def tts_stability(prompts, completions, ended: Sequence[Any] | None = None,
                  expected_duration_s: Sequence[Any] | None = None, sampling_rate: int | None = None,
                  require_eos: bool = True, min_seconds: float = 0.2, max_seconds: float = 60.0,
                  silence_rms: float = 1e-4, clipping_amplitude: float = 0.999, max_clipping_fraction: float = 0.01,
                  max_repetition_fraction: float = 0.8, **kwargs) -> list[float]:
    """1 when a completion passes every stability gate, else 0 (module docstring)."""
    if require_eos and ended is None:
        raise ValueError("tts_stability: require_eos=true needs the rollout's `ended` column (a speech policy's); "
                         "give require_eos=false for completions without one")
    settings = dict(require_eos=require_eos, min_seconds=min_seconds, max_seconds=max_seconds, silence_rms=silence_rms,
                    clipping_amplitude=clipping_amplitude, max_clipping_fraction=max_clipping_fraction,
                    max_repetition_fraction=max_repetition_fraction)
    out = []
    for i, completion in enumerate(completions):
        samples, rate = waveform("tts_stability", completion, i, sampling_rate)
        expected = expected_duration_s[i] if expected_duration_s is not None else None
        gates = failed_gates(samples, rate, None if expected is None else float(expected),
                             None if ended is None else bool(ended[i]), settings)
        out.append(0.0 if gates else 1.0)
    return out
