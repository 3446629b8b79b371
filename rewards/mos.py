"""A MOS predictor as a reward (`mos`): DNSMOS P.835, Microsoft's non-intrusive speech quality model
(the ONNX file `sig_bak_ovr.onnx` of the DNS Challenge's DNSMOS folder, run with onnxruntime), read
as its authors' evaluator reads it (DNSMOS/dnsmos_local.py):

    audio at 16 kHz, tiled (appended to itself) until it is at least 9.01 s long;
    windows of 9.01 s every 1 s (int(floor(seconds) - 9.01) + 1 of them; one whose end, computed in
    floating point, falls a sample short is skipped, as there);
    each window -> the model's raw (SIG, BAK, OVRL) -> the P.835 polynomials (`personalized`: the set
    for personalized noise suppression) -> the mean over windows.

The reward maps the chosen score (`score`: OVRL by default) to [0, 1] as UniRL's TTS MOS reward
(`tts_utmos`) maps a MOS: clip((mos - floor) / (ceiling - floor), 0, 1) with floor 1 and ceiling 5;
`tts_composite`'s `mos: mos` gates on that mapped value (0.30 by default, a MOS of 2.2).

Conventions: `calibrated: false` reads the raw model outputs (no polynomial), and `windows: false`
feeds the whole clip once; both false is UniRL's `dnsmos` backend (whole clip, raw OVRL). DNSMOS's
second model (P.808, on log-mel features) is not read. UTMOS's package needs fairseq and torchaudio,
which mmrl does not install; a UTMOS scorer in its own environment behind `mmrl serve-reward` speaks
the same protocol. Audio at another rate is resampled with a polyphase filter (`audio_models`), where
the authors' script uses librosa's soxr: scores then differ in the resampler's last digits."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from mmrl.core.scoring import register_reward

from .audio_models import resample, waveform
from .outputs import AUDIO

RATE = 16000           # DNSMOS's sampling rate
WINDOW_SECONDS = 9.01  # its input length
SCORES = ("SIG", "BAK", "OVRL")
# DNSMOS P.835's calibration polynomials (highest power first), as its evaluator applies them
POLYNOMIALS = {
    False: {"SIG": (-0.08397278, 1.22083953, 0.0052439), "BAK": (-0.13166888, 1.60915514, -0.39604546),
            "OVRL": (-0.06766283, 1.11546468, 0.04602535)},
    True: {"SIG": (-0.01019296, 0.02751166, 1.19576786, -0.24348726),
           "BAK": (-0.04976499, 0.44276479, -0.1644611, 0.96883132),
           "OVRL": (-0.00533021, 0.005101, 1.18058466, -0.11236046)},
}


@functools.lru_cache(maxsize=4)
def _session(model: str, device: str) -> Any:
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError("mos: DNSMOS runs with onnxruntime: pip install 'mmrl[mos]'") from e
    if not Path(model).is_file():
        raise ValueError(f"mos: model={model!r} is not a file (the DNSMOS ONNX model, sig_bak_ovr.onnx)")
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device.startswith("cuda") else ["CPUExecutionProvider"]
    return onnxruntime.InferenceSession(model, providers=providers)


def _windows(samples: np.ndarray, windows: bool) -> list[np.ndarray]:
    """The 16 kHz clip's 9.01 s windows every second, after tiling (module docstring); the whole clip
    once without `windows`."""
    if not windows:
        return [samples]
    length = int(WINDOW_SECONDS * RATE)
    while len(samples) < length:
        samples = np.append(samples, samples)
    hops = int(np.floor(len(samples) / RATE) - WINDOW_SECONDS) + 1
    # the evaluator's ends are int((hop + 9.01) * 16000) in floating point: where that rounds down a
    # sample, the window is one sample short and skipped, as there
    cuts = [(hop * RATE, int((hop + WINDOW_SECONDS) * RATE)) for hop in range(hops)]
    return [samples[start:end] for start, end in cuts if len(samples[start:end]) >= length]


def dnsmos_scores(session: Any, samples: np.ndarray, personalized: bool = False, calibrated: bool = True,
                  windows: bool = True) -> dict[str, float]:
    """{SIG, BAK, OVRL} of one 16 kHz clip: the mean over its windows of the (calibrated) model outputs."""
    name = session.get_inputs()[0].name
    per_window = []
    for window in _windows(samples.astype(np.float32), windows):
        raw = np.asarray(session.run(None, {name: window[np.newaxis, :]})[0], dtype=np.float64).reshape(-1)
        if raw.size != len(SCORES):
            raise ValueError(f"mos: the model gives {raw.size} values a clip, not DNSMOS P.835's 3 (SIG, BAK, OVRL)")
        per_window.append([np.polyval(POLYNOMIALS[personalized][s], v) if calibrated else v
                           for s, v in zip(SCORES, raw)])
    return dict(zip(SCORES, np.mean(per_window, axis=0).tolist()))


@register_reward("mos", outputs=AUDIO)
def mos(prompts, completions, model: str = "", score: str = "OVRL", personalized: bool = False,
        calibrated: bool = True, windows: bool = True, floor: float = 1.0, ceiling: float = 5.0,
        sampling_rate: int | None = None, device: Any = None, **kwargs) -> list[float]:
    """clip((MOS - floor) / (ceiling - floor), 0, 1) of each audio completion's DNSMOS `score`
    (module docstring); `model` is the path of DNSMOS's sig_bak_ovr.onnx."""
    if score not in SCORES:
        raise ValueError(f"mos: score={score!r} is not one of {', '.join(SCORES)}")
    if ceiling <= floor:
        raise ValueError(f"mos: ceiling={ceiling} must be above floor={floor}")
    if not model:
        raise ValueError("mos: give model=PATH, the DNSMOS ONNX model (sig_bak_ovr.onnx of the DNS Challenge)")
    session = _session(str(model), str(device or "cpu"))
    out = []
    for i, completion in enumerate(completions):
        samples, rate = waveform("mos", completion, i, sampling_rate)
        value = dnsmos_scores(session, resample(samples, rate, RATE), personalized, calibrated, windows)[score]
        out.append(min(max((value - floor) / (ceiling - floor), 0.0), 1.0))
    return out
