"""The synthetic speech of the ASR demo: transcripts match the words spoken, every word sounds
different, unknown words and bad lengths are named."""

import random

import numpy as np
import pytest
from mmrl.tasks.demos.synthetic.spoken_words import RATE, WORDS, spoken_words, utterance


def test_rows_carry_audio_and_transcript():
    data = spoken_words(n_train=20, n_eval=5, min_words=1, max_words=3, seed=1)
    assert len(data["train"]) == 20 and len(data["eval"]) == 5
    for row in data["train"]:
        words = row["reference"].split()
        assert 1 <= len(words) <= 3 and set(words) <= set(WORDS) and row["target"] == row["reference"]
        clip = row["audio"]["array"]
        assert row["audio"]["sampling_rate"] == RATE and clip.dtype == np.float32 and np.isfinite(clip).all()
    # longer transcripts are longer clips (same speaking rate range)
    lengths = {n: [len(r["audio"]["array"]) for r in data["train"] if len(r["reference"].split()) == n] for n in (1, 3)}
    assert max(lengths[1]) < min(lengths[3])
    assert spoken_words(n_train=3, n_eval=0, seed=1)["train"][0]["reference"] == data["train"][0]["reference"]


def test_every_word_has_its_own_spectrum():
    """The dominant frequencies of each word's two syllables differ from every other word's."""
    def peaks(word: str) -> tuple:
        clip = utterance([word], random.Random(0))
        half = len(clip) // 2
        out = []
        for part in (clip[:half], clip[half:]):
            spectrum = np.abs(np.fft.rfft(part, n=RATE))  # 1 Hz bins
            out.append(int(np.argmax(spectrum)) // 50)
        return tuple(out)
    signatures = {w: peaks(w) for w in WORDS}
    assert len(set(signatures.values())) == len(WORDS), signatures


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="'eleven'"):
        utterance(["one", "eleven"], random.Random(0))
    with pytest.raises(ValueError, match="min_words"):
        spoken_words(n_train=2, min_words=3, max_words=2)


def test_a_tiny_audio_lm_with_a_two_second_window_reads_the_clips():
    from mmrl.tasks.lm.audio_lm import AudioLMConfig, AudioLMPolicy
    rows = spoken_words(n_train=2, n_eval=0, min_words=3, max_words=3, seed=2)["train"]
    assert max(len(r["audio"]["array"]) for r in rows) < 2 * RATE  # three words fit the window
    policy = AudioLMPolicy(AudioLMConfig(model="tiny:qwen2-audio-char", tiny_args={"max_seconds": 2}, max_new_tokens=4))
    assert policy.processor.feature_extractor.nb_max_frames == 200
    rollout = policy.rollout(rows, 2, seeds=[0, 1])
    assert len(rollout.completions) == 4
    loss = policy.supervised_loss(policy.model, rows, "target")
    assert loss.isfinite() and loss > 0


def test_the_demo_figure_shows_each_clip_with_its_transcripts(tmp_path):
    from mmrl.tasks.demos.synthetic.spoken_words import draw_predictions
    rows = spoken_words(n_train=3, n_eval=0, seed=3)["train"]
    draw_predictions(rows, ["one", "", "x"], [r["reference"] for r in rows], tmp_path / "samples.png")
    assert (tmp_path / "samples.png").stat().st_size > 1000
