"""What the audio rewards share: waveforms out of completions and data columns, resampling, and the
judge models (a speaker encoder, CLAP), loaded once per (name, device) or registered already built
(a tiny random model in tests, no download).

A waveform value is a 1-D float array or tensor of samples, or {"array", "sampling_rate"}; a data
column may also hold a path to a sound file (read with soundfile)."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

_LOADED: dict[tuple[str, str, str], tuple[Any, Any]] = {}  # (kind, name, device) -> (processor, model)
_REGISTERED: dict[tuple[str, str], tuple[Any, Any]] = {}   # (kind, name) -> (processor, model)


def register_audio_model(kind: str, name: str, processor: Any, model: Any) -> None:
    """Make a built (processor, model) pair of `kind` ("speaker", "clap") available as `name`."""
    _REGISTERED[(kind, name)] = (processor, model)


def device_or_default(device: Any) -> str:
    import torch
    return str(device) if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")


def load_audio_model(kind: str, name: str, device: Any, load: Callable[[str], tuple[Any, Any]]) -> tuple[Any, Any]:
    """The (processor, model) of `kind` named `name`: a registered pair (moved to `device` when one is
    given), else `load(name)` once per (kind, name, device), in eval mode on that device."""
    if (kind, name) in _REGISTERED:
        processor, model = _REGISTERED[(kind, name)]
        if device is not None:
            model.to(device)
        return processor, model
    key = (kind, name, device_or_default(device))
    if key not in _LOADED:
        processor, model = load(name)
        _LOADED[key] = (processor, model.to(key[2]).eval().requires_grad_(False))
    return _LOADED[key]


def resample(wave: np.ndarray, orig_rate: int, target_rate: int) -> np.ndarray:
    """`wave` resampled from `orig_rate` to `target_rate` Hz with a polyphase filter
    (``scipy.signal.resample_poly``); output length ceil(len * target / orig)."""
    if orig_rate == target_rate:
        return wave
    from scipy.signal import resample_poly

    g = math.gcd(int(orig_rate), int(target_rate))
    return resample_poly(wave, int(target_rate) // g, int(orig_rate) // g).astype(np.float32)


def waveform(reward: str, value: Any, i: int, sampling_rate: int | None, what: str = "completion") -> tuple[np.ndarray, int]:
    """(float32 1-D samples, rate) of one audio value (a completion, or with another `what` a data column's,
    which may also be a sound file's path); a bad one fails naming the reward, `what` and row `i`."""
    rate = sampling_rate
    if isinstance(value, dict):
        if "array" not in value:
            raise ValueError(f"{reward}: {what} {i} is a dict without an 'array' of samples")
        rate = value.get("sampling_rate", sampling_rate)
        value = value["array"]
    elif isinstance(value, str) and what != "completion":  # a data column may name a sound file
        import soundfile
        try:
            value, rate = soundfile.read(value, dtype="float32", always_2d=True)
        except (RuntimeError, OSError, soundfile.LibsndfileError) as e:
            raise ValueError(f"{reward}: {what} {i}: audio file cannot be read: {e}") from e
        value = value.mean(axis=1)
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().float().cpu().numpy()
    if not isinstance(value, np.ndarray) or value.ndim != 1 or not np.issubdtype(value.dtype, np.floating):
        raise ValueError(f"{reward}: {what} {i} is not audio (a 1-D float array or tensor of samples, "
                         f"{{'array': ..., 'sampling_rate': ...}} or a sound file path): got {type(value).__name__} "
                         f"{getattr(value, 'shape', '')}")
    if rate is None:
        raise ValueError(f"{reward}: {what} {i} has no sampling rate (give 'sampling_rate' in the value or the "
                         f"sampling_rate= argument)")
    if not (isinstance(rate, (int, np.integer)) or float(rate).is_integer()) or rate <= 0:
        raise ValueError(f"{reward}: {what} {i} has sampling_rate={rate!r}, not a positive integer")
    return value.astype(np.float32, copy=False), int(rate)
