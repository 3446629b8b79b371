"""The audio-visual synchrony reward `av_sync` (AV-Align, rewards/av_sync.py) against hand-written
references: the motion energy, the video peaks, the onsets of clicks, the IoU of two peak lists, and
whole videos whose jumps and clicks coincide, or not; LTX-2's completions are scored."""

import numpy as np
import pytest
import torch
from mmrl.rewards.av_sync import audio_peaks, av_align, av_sync, motion_energy, onset_envelope, video_peaks

FPS, RATE, FRAMES = 8.0, 8000, 16


def stepping(at):
    """[T, 3, 4, 4] float frames whose grey level jumps by 0.3 at each frame of `at` and holds."""
    frames = torch.zeros(FRAMES, 3, 4, 4)
    for t in at:
        frames[t:] += 0.3
    return frames


def clicks(times):
    """Silence of FRAMES / FPS seconds with a 5 ms burst of a 1 kHz tone at each of `times` (s)."""
    samples = np.zeros(int(FRAMES / FPS * RATE))
    for t in times:
        start = int(t * RATE)
        n = np.arange(int(0.005 * RATE))
        samples[start:start + len(n)] = np.sin(2 * np.pi * 1000 * n / RATE)
    return samples.astype(np.float32)


def test_motion_energy_and_video_peaks_by_hand():
    frames = torch.zeros(5, 3, 2, 2)
    frames[2] = 0.5  # differences: 0, 0.5, 0.5, 0 -> energy [0, 0, 0.5, 0.5, 0]
    assert np.allclose(motion_energy(frames), [0.0, 0.0, 0.5, 0.5, 0.0])
    # strict local maxima above the threshold: t = 2 (0.1 < 0.3 > 0.2) and t = 4; not t = 1 (below it)
    energy = np.array([0.0, 0.005, 0.001, 0.3, 0.2, 0.4, 0.1])
    assert video_peaks(energy, 2.0, 0.01) == [1.5, 2.5]


def test_av_align_iou_by_hand():
    # audio 0.5 matches video 0.55 (within 1 / 8 s); 1.0 matches none; video 1.6 unmatched: 1 / (2 + 2 - 1)
    assert av_align([0.5, 1.0], [0.55, 1.6], 8.0) == pytest.approx(1 / 3)
    assert av_align([0.5], [0.5 + 1 / 8], 8.0) == 0.0  # exactly one frame apart: not within it (strict)
    assert av_align([], [], 8.0) == 0.0


def test_onsets_of_clicks_are_found_where_they_are():
    envelope, hop = onset_envelope(clicks([0.5, 1.25]), RATE)
    assert envelope.max() == 1.0 and envelope.min() == 0.0
    peaks = audio_peaks(envelope, hop)
    assert len(peaks) == 2 and all(abs(p - t) <= 2 * hop for p, t in zip(peaks, [0.5, 1.25]))


def test_jumps_with_their_clicks_score_one_and_late_ones_zero():
    # a jump at frame t is the only change of the pair (t - 1, t): one motion peak at t / fps; the
    # clicks sit there, two frames later, or one on time and one late (IoU 1 / (2 + 2 - 1))
    video = stepping([3, 9])
    assert video_peaks(motion_energy(video), FPS, 0.01) == [3 / FPS, 9 / FPS]
    rows = [{"frames": video, "array": clicks(times), "sampling_rate": RATE}
            for times in ([3 / FPS, 9 / FPS], [5 / FPS, 11 / FPS], [3 / FPS, 11 / FPS])]
    assert av_sync(["a drum"] * 3, rows, fps=[FPS] * 3) == pytest.approx([1.0, 0.0, 1 / 3])


def test_bad_inputs_name_the_row():
    with pytest.raises(ValueError, match="av_sync: completion 0 is not a video with its sound"):
        av_sync(["x"], [{"array": np.zeros(10, dtype=np.float32), "sampling_rate": RATE}], fps=[FPS])
    with pytest.raises(ValueError, match="av_sync: row 0 has no positive `fps`"):
        av_sync(["x"], [{"frames": stepping([1]), "array": clicks([]), "sampling_rate": RATE}], fps=[None])
