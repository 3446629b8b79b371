"""The MOS reward (DNSMOS P.835 through onnxruntime) against a hand-written reading of its authors'
evaluator, with a tiny ONNX model of DNSMOS's shape whose outputs numpy computes independently."""

import numpy as np
import pytest
from tiny_audio_judges import TINY_MOS_BIAS, TINY_MOS_WEIGHT, tiny_mos_model

from mmrl.rewards import get_reward
from mmrl.rewards.mos import POLYNOMIALS, dnsmos_scores

pytest.importorskip("onnxruntime")
RATE = 16000


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_mos_model(tmp_path_factory.mktemp("mos") / "tiny_dnsmos.onnx")


def clip(seconds: float, seed: int, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size) + 0.02 * seed).astype(np.float32)


def by_hand(samples, personalized=False, calibrated=True):
    """DNSMOS's reading written out: tile to 9.01 s, 9.01 s windows every second, the tiny model's
    affine map of (mean, mean square) in numpy, the P.835 polynomial, the mean over windows."""
    length = int(9.01 * RATE)
    while len(samples) < length:
        samples = np.concatenate([samples, samples])
    hops = int(np.floor(len(samples) / RATE) - 9.01) + 1
    rows = []
    for h in range(hops):
        w = samples[h * RATE:int((h + 9.01) * RATE)].astype(np.float64)
        if len(w) < length:  # its float end falls a sample short: the evaluator skips the window
            continue
        raw = np.array([w.mean(), (w * w).mean()]) @ np.array(TINY_MOS_WEIGHT) + np.array(TINY_MOS_BIAS)
        rows.append([np.poly1d(POLYNOMIALS[personalized][s])(v) if calibrated else v
                     for s, v in zip(("SIG", "BAK", "OVRL"), raw)])
    return np.mean(rows, axis=0), len(rows)


@pytest.mark.parametrize("seconds", [2.5, 9.01, 12.6, 20.3])
@pytest.mark.parametrize("personalized", [False, True])
def test_scores_are_the_authors_windows_and_polynomials(model, seconds, personalized):
    import onnxruntime
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    samples = clip(seconds, 1)
    expected, windows = by_hand(samples, personalized)
    # a long clip is read in several windows (20.3 s: 11, of which the evaluator's float ends drop 4),
    # a short one tiled
    assert windows == {2.5: 1, 9.01: 1, 12.6: 3, 20.3: 7}[seconds]
    got = dnsmos_scores(session, samples, personalized)
    assert [got[s] for s in ("SIG", "BAK", "OVRL")] == pytest.approx(expected, abs=2e-5)


def test_the_reward_maps_the_chosen_score_and_unirls_reading_is_the_raw_whole_clip(model):
    clips = [clip(3.0, seed) for seed in range(3)]
    got = get_reward("mos")(["p"] * 3, clips, model=model, sampling_rate=RATE)
    expected = [min(max((by_hand(c)[0][2] - 1) / 4, 0), 1) for c in clips]
    assert got == pytest.approx(expected, abs=1e-5) and len(set(np.round(got, 6))) == 3
    sig = get_reward("mos")(["p"], clips[:1], model=model, sampling_rate=RATE, score="SIG")
    assert sig == pytest.approx([min(max((by_hand(clips[0])[0][0] - 1) / 4, 0), 1)], abs=1e-5)
    raw = get_reward("mos")(["p"], clips[:1], model=model, sampling_rate=RATE, calibrated=False, windows=False)
    c = clips[0].astype(np.float64)
    whole = np.array([c.mean(), (c * c).mean()]) @ np.array(TINY_MOS_WEIGHT) + np.array(TINY_MOS_BIAS)
    assert raw == pytest.approx([min(max((whole[2] - 1) / 4, 0), 1)], abs=1e-5)


def test_other_rates_are_resampled_to_16_khz(model):
    at_24k = clip(3.0, 2, rate=24000)
    from mmrl.rewards.audio_models import resample
    got = get_reward("mos")(["p"], [{"array": at_24k, "sampling_rate": 24000}], model=model)
    expected = (by_hand(resample(at_24k, 24000, RATE))[0][2] - 1) / 4
    assert got == pytest.approx([min(max(expected, 0), 1)], abs=1e-5)


def test_the_composite_gates_on_the_mos_reward(model):
    clips = [clip(3.0, 0), np.zeros(RATE * 3, np.float32)]  # silence: the tiny model's OVRL is its bias
    mos = get_reward("mos")(["p"] * 2, clips, model=model, sampling_rate=RATE)
    got = get_reward("tts_composite")(["p"] * 2, clips, weights={"mos": 1.0}, gates={"mos": 0.5}, penalties={},
                                      content="mos", components={"mos": {"model": model, "sampling_rate": RATE}})
    assert got == [pytest.approx(mos[0]) if mos[0] >= 0.5 else 0.0, mos[1] if mos[1] >= 0.5 else 0.0]


def test_bad_settings_are_named(model, tmp_path):
    with pytest.raises(ValueError, match="score='MOS' is not one of SIG, BAK, OVRL"):
        get_reward("mos")(["p"], [clip(1, 0)], model=model, sampling_rate=RATE, score="MOS")
    with pytest.raises(ValueError, match="is not a file"):
        get_reward("mos")(["p"], [clip(1, 0)], model=str(tmp_path / "missing.onnx"), sampling_rate=RATE)
    with pytest.raises(ValueError, match="give model=PATH"):
        get_reward("mos")(["p"], [clip(1, 0)], sampling_rate=RATE)
    with pytest.raises(ValueError, match="mos: completion 0 has no sampling rate"):
        get_reward("mos")(["p"], [clip(1, 0)], model=model)
