"""The speech and sound rewards against hand-written references with tiny random judges:
speaker similarity (WavLM x-vector cosine) and CLAP (text-audio cosine)."""

import numpy as np
import pytest
import torch
from tiny_audio_judges import tiny_clap, tiny_mos_model, tiny_speaker_encoder

from mmrl.rewards import get_reward, register_reward
from mmrl.rewards.audio_models import register_audio_model, resample


def noise(seconds: float, rate: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(seconds * rate)) * 0.1).astype(np.float32)


@pytest.fixture(scope="module")
def speaker():
    extractor, model = tiny_speaker_encoder()
    register_audio_model("speaker", "tiny-speaker", extractor, model)
    return extractor, model


def xvector(extractor, model, samples):
    with torch.no_grad():
        e = model(**extractor(samples, sampling_rate=16000, return_tensors="pt")).embeddings[0]
    return e / e.norm()


def test_speaker_similarity_is_the_clipped_cosine_of_x_vectors(speaker):
    extractor, model = speaker
    a, b, c = noise(1.0, 16000, 0), noise(0.8, 16000, 1), noise(1.2, 24000, 2)
    fn = get_reward("speaker_similarity")
    got = fn([None] * 3, [a, {"array": b, "sampling_rate": 16000}, {"array": c, "sampling_rate": 24000}],
             speaker_audio=[a, {"array": a, "sampling_rate": 16000}, None],
             speaker_embedding=[None, None, xvector(extractor, model, b).tolist()],
             model="tiny-speaker", sampling_rate=16000)
    ea, eb, ec = (xvector(extractor, model, x) for x in (a, b, resample(c, 24000, 16000)))
    expected = [1.0, max(float(eb @ ea), 0.0), max(float(ec @ eb), 0.0)]
    assert got == pytest.approx(expected, abs=1e-5)
    assert 0.0 < got[1] < 1.0  # two different clips: neither identical nor orthogonal
    floor = fn([None], [b], speaker_audio=[a], model="tiny-speaker", sampling_rate=16000, floor=0.5, ceiling=0.9)
    assert floor == pytest.approx([min(max((float(eb @ ea) - 0.5) / 0.4, 0.0), 1.0)], abs=1e-5)


def test_speaker_similarity_without_a_reference_is_none_and_bad_values_are_named(speaker):
    fn = get_reward("speaker_similarity")
    assert fn([None], [noise(0.5, 16000, 3)], model="tiny-speaker", sampling_rate=16000) == [None]
    with pytest.raises(ValueError, match="speaker_similarity: speaker_audio 0 has no sampling rate"):
        fn([None], [noise(0.5, 16000, 3)], speaker_audio=[noise(0.5, 16000, 4)], model="tiny-speaker")
    with pytest.raises(ValueError, match="row 0: the reference embedding has 3 dimensions"):
        fn([None], [noise(0.5, 16000, 3)], speaker_embedding=[[1.0, 0.0, 0.0]], model="tiny-speaker", sampling_rate=16000)


def test_clap_is_the_cosine_of_clap_models_own_embeddings():
    processor, model = tiny_clap()
    register_audio_model("clap", "tiny-clap", processor, model)
    waves = [noise(0.7, 48000, 5), noise(0.4, 16000, 6)]
    texts = ["a dog barks", "rain on a roof"]
    got = get_reward("clap")([{"prompt": "ignored"}, "rain on a roof"], [{"array": waves[0], "sampling_rate": 48000},
                                                                          {"array": waves[1], "sampling_rate": 16000}],
                             caption=["a dog barks", None], model="tiny-clap")
    audio = processor.feature_extractor([waves[0], resample(waves[1], 16000, 48000)], sampling_rate=48000,
                                        return_tensors="pt")
    tokens = processor.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():  # the model's forward: its normalised embeddings and logit scale
        out = model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"],
                    input_features=audio["input_features"], is_longer=audio["is_longer"])
    expected = out.logits_per_audio.diagonal() / model.logit_scale_a.exp()
    assert got == pytest.approx(expected.tolist(), abs=1e-5)
    assert len(set(round(g, 4) for g in got)) == 2


# -- tts_stability and tts_composite ----------------------------------------------------------------

def stability(completions, ended=None, **args):
    return get_reward("tts_stability")([None] * len(completions), completions,
                                       ended=[True] * len(completions) if ended is None else ended,
                                       sampling_rate=16000, **args)


def test_tts_stability_fails_each_gate_on_its_own():
    clean = noise(1.0, 16000, 7)
    periodic = np.tile(noise(0.2, 16000, 8), 5)  # the same 0.2 s frame five times
    clipped = clean.copy()
    clipped[:400] = 1.0  # 2.5% of the samples at full scale
    assert stability([clean, np.zeros(16000, np.float32), clipped, clean[:1600], periodic]) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert stability([clean, clean], ended=[True, False]) == [1.0, 0.0]
    assert stability([clean, clean], expected_duration_s=[0.5, 5.0]) == [1.0, 0.0]  # 1 s: 2x and 0.2x
    assert stability([clean], ended=[False], require_eos=False) == [1.0]
    with pytest.raises(ValueError, match="needs the rollout's `ended` column"):
        get_reward("tts_stability")([None], [clean], sampling_rate=16000)


def _column_score(name):
    """A component reward that reads its scores from the column of its own name."""
    def score(prompts, completions, **columns):
        return list(columns[name])
    return score


for _name in ("content_score", "voice_score", "stable_score"):
    register_reward(_name)(_column_score(_name))


def test_tts_composite_weights_gates_and_penalises_as_unirl():
    columns = {"content_score": [0.9, 0.9, 0.5, 1.0, None], "voice_score": [0.8, 0.3, 0.6, 0.9, 0.9],
               "stable_score": [1.0, 1.0, 1.0, 0.0, 1.0]}
    got = get_reward("tts_composite")([None] * 5, [None] * 5, weights={"content_score": 0.6, "voice_score": 0.15,
                                                                        "stable_score": 0.1},
                                      gates={"stable_score": 1.0}, penalties={"voice_score": [0.4, 0.5]},
                                      content="content_score", **columns)
    def mean(c, v, s):
        return (0.6 * c + 0.15 * v + 0.1 * s) / 0.85
    expected = [mean(0.9, 0.8, 1.0), 0.5 * mean(0.9, 0.3, 1.0), mean(0.5, 0.6, 1.0), 0.0, None]
    assert got[:4] == pytest.approx(expected[:4]) and got[4] is None
    with pytest.raises(ValueError, match="under min_content_weight_fraction=0.5"):
        get_reward("tts_composite")([None], [None], weights={"content_score": 0.2, "voice_score": 0.8},
                                    gates={}, penalties={}, content="content_score", **columns)


@pytest.mark.slow  # about 30 s on 2 loaded cores: two reward servers start, each importing torch and transformers
def test_speech_rewards_served_give_the_in_process_values(tmp_path):
    """speaker_similarity, clap and mos behind `mmrl serve-reward` (the tiny judges registered by a reward
    module in the server; the tiny DNSMOS-shaped ONNX file by its path): the clips and reference voices
    travel the wire as arrays."""
    from served import HERE, free_port, running, serve_command

    from mmrl.config.remote import ClientSettings
    from mmrl.registry import import_user_module
    from mmrl.serving.remote_reward import RemoteReward
    from mmrl.serving.transport import Transport
    import_user_module(str(HERE / "speech_judges.py"), "reward_modules")
    clips = [{"array": noise(0.5 + 0.25 * i, 16000, 20 + i), "sampling_rate": 16000} for i in range(3)]
    voices = [{"array": noise(0.6, 16000, 30 + i), "sampling_rate": 16000} for i in range(3)]
    for name, columns, args in (("speaker_similarity", {"speaker_audio": voices}, {"model": "tiny-speaker"}),
                                ("clap", {"caption": ["a dog", "rain", "wind"]}, {"model": "tiny-clap"}),
                                ("mos", {}, {"model": tiny_mos_model(tmp_path / "tiny_dnsmos.onnx")})):
        port = free_port()
        with running(serve_command(name, port, "--reward-module", str(HERE / "speech_judges.py")), port) as (url, _):
            served = RemoteReward(name, get_reward(name), Transport([url], ClientSettings()), args)
            got = served(["p"] * 3, clips, **columns)
        assert got == pytest.approx(get_reward(name)(["p"] * 3, clips, **columns, **args), abs=1e-6), name
