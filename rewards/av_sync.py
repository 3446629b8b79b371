"""Audio-visual synchrony of a video with its sound: AV-Align (Yariv et al., "Diverse and Aligned
Audio-to-Video Generation via Text-to-Video Model Adaptation", AAAI 2024; the authors' av_align.py in
guyyariv/TempoTokens), the intersection over union of the sound's onsets and the picture's motion peaks.

    audio peaks A: onsets of the sound (times in seconds)
    video peaks V: frames t (time t / fps) whose motion energy m_t is a strict local maximum,
                   m_{t-1} < m_t > m_{t+1}, above `motion_threshold`
    matched:       the audio peaks with a video peak within one frame, |a - v| < 1 / fps
    AV-Align     = matched / (|A| + |V| - matched)     (0 when there is no peak at all)

As the authors': the motion energy of frame t is that of the pair (t - 1, t), frame 0 repeating the
first pair's; peaks and the IoU are theirs. Two parts are measured differently here, without OpenCV
or librosa: the motion energy is the mean absolute difference of consecutive grey frames in [0, 1]
(theirs: the mean Farneback optical-flow magnitude in pixels, so the threshold differs: 0.1 pixels
there, `motion_threshold` = 0.01 of the grey range here), and the onsets are librosa's default
onset detection written out: the onset envelope is the mean over frequency of the half-wave
rectified rise of the log power spectrum (dB, floor -80 dB under the peak) between STFT frames
(window ~93 ms, hop ~23 ms, librosa's 2048 / 512 at 22.05 kHz, centred), normalised to [0, 1]; an
onset is a frame that is the maximum of the 30 ms before it to the frame after it, at least 0.07
above the mean of the 100 ms around it, 30 ms after the previous onset (librosa's `peak_pick`
defaults) -- on a linear-frequency spectrum (librosa's: 128 mel bands). The completion is
{"frames", "array", "sampling_rate"} with the row's `fps` column (docs/rewards.md)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mmrl.core.scoring import register_reward

from .audio_models import waveform
from .outputs import AUDIO_VIDEO
from .video_frames import frame_tensor

WINDOW_S, HOP_S = 2048 / 22050, 512 / 22050  # librosa's default STFT at its default rate, in seconds
PRE_MAX_S, PRE_AVG_S, POST_AVG_S, WAIT_S, DELTA = 0.03, 0.1, 0.1, 0.03, 0.07  # librosa.onset.onset_detect's


def motion_energy(frames: Any) -> np.ndarray:
    """m [T]: the mean absolute difference of each frame from the one before in grey [0, 1], frame 0
    taking frame 1's (AV-Align's repeat of the first pair)."""
    grey = frame_tensor(frames).mean(1).numpy().astype(np.float64)  # [T, H, W]
    if len(grey) < 2:
        return np.zeros(len(grey))
    diffs = np.abs(np.diff(grey, axis=0)).mean(axis=(1, 2))
    return np.concatenate([diffs[:1], diffs])


def video_peaks(energy: np.ndarray, fps: float, threshold: float) -> list[float]:
    """Times (s) of the strict local maxima of the motion energy above `threshold` (AV-Align's)."""
    return [t / fps for t in range(1, len(energy) - 1)
            if energy[t - 1] < energy[t] > energy[t + 1] and energy[t] > threshold]


def onset_envelope(samples: np.ndarray, rate: int) -> tuple[np.ndarray, float]:
    """(the onset envelope [J] normalised to [0, 1], its frames' hop in seconds): the mean over frequency
    of the rectified rise of the log power spectrum between consecutive centred STFT frames."""
    window = max(4, int(round(WINDOW_S * rate)))
    hop = max(1, int(round(HOP_S * rate)))
    padded = np.pad(samples.astype(np.float64), window // 2, mode="reflect" if len(samples) > window // 2 else "constant")
    starts = range(0, max(len(padded) - window, 0) + 1, hop)
    spectra = np.stack([np.abs(np.fft.rfft(padded[s:s + window] * np.hanning(window))) ** 2 for s in starts])
    db = 10 * np.log10(np.maximum(spectra, 1e-10))
    db = np.maximum(db, db.max() - 80.0)
    rise = np.maximum(0.0, np.diff(db, axis=0)).mean(axis=1)
    envelope = np.concatenate([[0.0], rise])  # frame j's rise from frame j - 1 (frame 0 has none)
    span = envelope.max() - envelope.min()
    return (envelope - envelope.min()) / span if span > 0 else np.zeros_like(envelope), hop / rate


def audio_peaks(envelope: np.ndarray, hop_s: float) -> list[float]:
    """Times (s) of the onsets of a normalised envelope (librosa's `peak_pick` rule, module docstring)."""
    pre_max, pre_avg, post_avg, wait = (int(round(s / hop_s)) for s in (PRE_MAX_S, PRE_AVG_S, POST_AVG_S, WAIT_S))
    peaks, last = [], -np.inf
    for j in range(len(envelope)):
        local = envelope[max(0, j - pre_max):j + 2]
        around = envelope[max(0, j - pre_avg):j + post_avg + 1]
        if envelope[j] == local.max() and envelope[j] >= around.mean() + DELTA and j > last + wait:
            peaks.append(j * hop_s)
            last = j
    return peaks


def av_align(audio: Sequence[float], video: Sequence[float], fps: float) -> float:
    """AV-Align's IoU of audio peak times and video peak times (s), a match within one frame."""
    matched = sum(any(abs(a - v) < 1 / fps for v in video) for a in audio)
    union = len(audio) + len(video) - matched
    return matched / union if union else 0.0


@register_reward("av_sync", outputs=AUDIO_VIDEO)
def av_sync(prompts, completions, fps: Sequence[Any] | None = None, motion_threshold: float = 0.01,
            **kwargs) -> list[float | None]:
    """AV-Align of each video with its sound (module docstring); `fps`: the rows' frame rates."""
    if not isinstance(motion_threshold, (int, float)) or motion_threshold < 0:
        raise ValueError(f"av_sync: motion_threshold={motion_threshold!r} must be a number >= 0")
    out: list[float | None] = []
    for i, completion in enumerate(completions):
        if not (isinstance(completion, dict) and "frames" in completion):
            raise ValueError(f"av_sync: completion {i} is not a video with its sound ({{'frames', 'array', "
                             f"'sampling_rate'}}): got {type(completion).__name__}")
        rate_fps = float(fps[i]) if fps is not None and fps[i] else None
        if not rate_fps or rate_fps <= 0:
            raise ValueError(f"av_sync: row {i} has no positive `fps` column (the video's frames per second)")
        samples, rate = waveform("av_sync", completion, i, None)
        envelope, hop_s = onset_envelope(samples, int(rate))
        peaks_v = video_peaks(motion_energy(completion["frames"]), rate_fps, motion_threshold)
        out.append(av_align(audio_peaks(envelope, hop_s), peaks_v, rate_fps))
    return out
