"""WER / CER rewards against hand-computed error rates, and the Whisper `asr_wer` pipeline with a
tiny random Whisper built in memory (no download)."""

import mmrl.rewards  # noqa: F401  (registration)
import numpy as np
import pytest
import torch
from mmrl.rewards import wer as W
from mmrl.rewards.error_rates import char_error_rate, normalize_transcript, number_to_words, word_error_rate
from mmrl.rewards.wer import resample

from mmrl.core.scoring import get_reward

# -- error rates ---------------------------------------------------------------------------------

def test_wer_hand_computed():
    # the cat sat on the mat / the cat sit on mat: sat->sit (S), second "the" dropped (D): 2 / 6
    assert word_error_rate("the cat sat on the mat", "the cat sit on mat") == pytest.approx(2 / 6)
    assert word_error_rate("a b c", "a b c") == 0.0
    # one insertion over 3 words
    assert word_error_rate("a b c", "a b x c") == pytest.approx(1 / 3)


def test_cer_hand_computed():
    assert char_error_rate("abcd", "abed") == pytest.approx(1 / 4)
    # "ab cd" (5 chars incl. space) vs "ab c": one deletion
    assert char_error_rate("ab cd", "ab c") == pytest.approx(1 / 5)


def test_insertion_heavy_hypothesis_exceeds_one_and_scores_zero():
    ref, hyp = "hello", "hello there my good old friend"
    assert word_error_rate(ref, hyp) == pytest.approx(5.0)  # 5 insertions / 1 word
    assert get_reward("wer")([None], [hyp], reference=[ref]) == [0.0]


def test_empty_references():
    assert word_error_rate("", "") == 0.0
    assert word_error_rate("", "something here") == 1.0
    assert char_error_rate("", "") == 0.0
    assert char_error_rate("", "x") == 1.0
    # punctuation-only text normalises to empty
    assert word_error_rate("...", "!") == 0.0
    assert word_error_rate("a b", "") == 1.0  # all deletions
    assert get_reward("wer")([None, None], ["", "oops"], reference=["", ""]) == [1.0, 0.0]


# -- normaliser ----------------------------------------------------------------------------------

def test_normalize_case_punctuation_apostrophes():
    assert normalize_transcript("Hello, World!  How's it going?") == "hello world how's it going"
    assert normalize_transcript("I DON’T know -- 'quoted' well-known") == "i don't know quoted well known"
    assert normalize_transcript("Hello, World!", lowercase=False) == "Hello World"
    assert normalize_transcript("Hello,   World!", strip_punctuation=False) == "hello, world!"
    assert normalize_transcript("ﬁne\u00a0day") == "fine day"  # NFKC: ligature, nbsp


def test_numbers_to_words():
    assert normalize_transcript("I have 21 cats", numbers_to_words=True) == "i have twenty one cats"
    assert normalize_transcript("I have 21 cats") == "i have 21 cats"
    assert normalize_transcript("1,005 and 3rd and 1000000", numbers_to_words=True) == \
        "one thousand five and 3rd and 1000000"
    assert number_to_words(0) == "zero"
    assert number_to_words(105) == "one hundred five"
    assert number_to_words(999_999) == "nine hundred ninety nine thousand nine hundred ninety nine"
    assert word_error_rate("twenty one cats", "21 cats", numbers_to_words=True) == 0.0
    with pytest.raises(ValueError, match="n=1000000"):
        number_to_words(1_000_000)


# -- rewards -------------------------------------------------------------------------------------

def test_wer_and_cer_rewards():
    refs = ["the cat sat on the mat", None, "abcd"]
    comps = ["The cat sit on mat.", "whatever", "abcd"]
    out = get_reward("wer")([None] * 3, comps, reference=refs, other_column=[1, 2, 3])
    assert out[0] == pytest.approx(1 - 2 / 6) and out[1] is None and out[2] == 1.0
    assert get_reward("cer")([None], ["abed"], reference=["abcd"]) == [pytest.approx(0.75)]


def test_chat_message_completions():
    comps = [[{"role": "assistant", "content": "the cat sat"}],
             [{"role": "assistant", "content": [{"type": "text", "text": "a dog"}]}]]
    assert get_reward("wer")([None, None], comps, reference=["the cat sat", "a cat"]) == [1.0, 0.5]


def test_length_mismatch_names_reference():
    with pytest.raises(ValueError, match=r"'reference' has 1 values for 2 completions"):
        get_reward("wer")([None, None], ["a", "b"], reference=["a"])
    with pytest.raises(ValueError, match="reference"):
        get_reward("cer")([None], ["a"], reference=["a", "b"])


# -- asr_wer with a tiny random Whisper ----------------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|translate|>",
            "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]


def _tiny_whisper():
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperProcessor, WhisperTokenizer

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}  # byte-level BPE, no merges
    tok = WhisperTokenizer(vocab=vocab, merges=[])
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    ids = {s: tok.convert_tokens_to_ids(s) for s in SPECIALS}
    processor = WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=80), tokenizer=tok)
    eos, start = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    cfg = WhisperConfig(vocab_size=len(tok), d_model=32, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, num_mel_bins=80, max_target_positions=32,
                        decoder_start_token_id=start, eos_token_id=eos, pad_token_id=eos, bos_token_id=eos)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(cfg).eval()
    gc = model.generation_config
    gc.decoder_start_token_id, gc.eos_token_id, gc.pad_token_id = start, eos, eos
    gc.forced_decoder_ids = gc.begin_suppress_tokens = gc.suppress_tokens = None
    gc.no_timestamps_token_id = ids["<|notimestamps|>"]
    return processor, model


@pytest.fixture(scope="module")
def tiny_whisper():
    return _tiny_whisper()


def test_resample_length():
    wave = np.random.default_rng(0).standard_normal(8000).astype(np.float32)  # 1 s at 8 kHz
    out = resample(wave, 8000, 16000)
    assert out.shape == (16000,) and out.dtype == np.float32
    assert resample(wave, 16000, 16000) is wave
    assert resample(np.zeros(441, np.float32), 44100, 16000).shape == (160,)


def test_asr_wer_end_to_end(tiny_whisper, tmp_path, monkeypatch):
    processor, model = tiny_whisper
    W.register_asr_model("tiny-test", processor, model)
    rng = np.random.default_rng(0)
    comps = [rng.standard_normal(16000).astype(np.float32) * 0.1,
             torch.randn(8000) * 0.1,
             {"array": rng.standard_normal(4000).astype(np.float32) * 0.1, "sampling_rate": 8000},
             rng.standard_normal(1600).astype(np.float32)]
    refs = ["hello world", "good morning", "", None]
    fn = get_reward("asr_wer")
    out = fn([None] * 4, comps, reference=refs, model="tiny-test", sampling_rate=16000, batch_size=2,
             max_new_tokens=8, device="cpu")
    assert len(out) == 4 and out[3] is None
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in out[:3])
    # the same scores as transcribing by hand and scoring the transcripts with the wer reward
    waves = [comps[0], comps[1].numpy(), resample(comps[2]["array"], 8000, 16000)]
    assert waves[2].shape == (8000,)
    texts = W.transcribe(waves, processor, model, batch_size=2, max_new_tokens=8)
    assert out[:3] == get_reward("wer")([None] * 3, texts, reference=refs[:3])

    # loading from a directory: once per (model, device), then a cache hit
    processor.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    from transformers import WhisperForConditionalGeneration
    calls = []
    real = WhisperForConditionalGeneration.from_pretrained.__func__

    def counting(cls, *a, **k):
        calls.append(a)
        return real(cls, *a, **k)

    monkeypatch.setattr(WhisperForConditionalGeneration, "from_pretrained", classmethod(counting))
    monkeypatch.setattr(W, "_ASR_MODELS", {})
    for _ in range(2):
        again = fn([None], [comps[0]], reference=["hello"], model=str(tmp_path), sampling_rate=16000,
                   max_new_tokens=4, device="cpu")
        assert 0.0 <= again[0] <= 1.0
    assert len(calls) == 1 and list(W._ASR_MODELS) == [(str(tmp_path), "cpu")]


def test_asr_wer_bad_audio(tiny_whisper):
    W.register_asr_model("tiny-test", *tiny_whisper)
    fn = get_reward("asr_wer")
    good = np.zeros(1600, np.float32)
    with pytest.raises(ValueError, match="completion 1 is not audio"):
        fn([None, None], [good, "some text"], reference=["a", "b"], model="tiny-test", sampling_rate=16000)
    with pytest.raises(ValueError, match="completion 0 is not audio"):
        fn([None], [np.zeros((2, 100), np.float32)], reference=["a"], model="tiny-test", sampling_rate=16000)
    with pytest.raises(ValueError, match="completion 0 has no sampling rate"):
        fn([None], [good], reference=["a"], model="tiny-test")
    with pytest.raises(ValueError, match="'reference' has 2 values for 1 completions"):
        fn([None], [good], reference=["a", "b"], model="tiny-test", sampling_rate=16000)


def test_batched_error_rates_equal_one_pair_at_a_time():
    import random

    from mmrl.rewards.error_rates import char_error_rate, error_rates, word_error_rate
    rng = random.Random(0)
    words = "the a cat dog sat on mat blue red went home fast".split()
    refs = [" ".join(rng.choices(words, k=rng.randint(0, 10))) for _ in range(200)]
    hyps = [" ".join(rng.choices(words, k=rng.randint(0, 10))) for _ in range(200)]
    assert error_rates(refs, hyps) == [word_error_rate(r, h) for r, h in zip(refs, hyps)]
    assert error_rates(refs, hyps, "char") == [char_error_rate(r, h) for r, h in zip(refs, hyps)]


# -- the GRPO-for-ASR paper's reward variants ---------------------------------------------------

def levenshtein_words(ref: str, hyp: str) -> int:
    """S + D + I by the textbook dynamic programme (independent of jiwer)."""
    r, h = ref.split(), hyp.split()
    d = [[i + j if i * j == 0 else 0 for j in range(len(h) + 1)] for i in range(len(r) + 1)]
    for i in range(1, len(r) + 1):
        for j in range(1, len(h) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (r[i - 1] != h[j - 1]))
    return d[-1][-1]


def test_wer_modes_against_hand_reference():
    # two hallucinations: WER 5/3 = 1.67 and 19/6 = 3.17 get different rewards, unclipped
    refs = ["one two three", "a b c d e f", "the cat sat", "the cat sat", "x y"]
    hyps = ["one two three four five six seven eight", "q " * 19,  # 5 insertions; 6 substitutions + 13 insertions
            "the cat sat", "The cat, sat!", "x z w"]
    errors = [levenshtein_words(normalize_transcript(r), normalize_transcript(h)) for r, h in zip(refs, hyps)]
    assert errors[:2] == [5, 19] and errors[0] / 3 != errors[1] / 6
    n = [len(r.split()) for r in refs]
    wer = get_reward("wer")
    assert wer([None] * 5, hyps, reference=refs, mode="negative") == pytest.approx([-e / k for e, k in zip(errors, n)])
    assert wer([None] * 5, hyps, reference=refs, mode="errors") == [-float(e) for e in errors]
    assert wer([None] * 5, hyps, reference=refs, mode="exact_match") == [float(e == 0) for e in errors]
    assert wer([None] * 5, hyps, reference=refs) == pytest.approx([1 - min(e / k, 1) for e, k in zip(errors, n)])
    assert wer([None] * 5, hyps, reference=refs, mode="one_minus_clipped")[:2] == [0.0, 0.0]  # the clip ties them
    assert get_reward("cer")([None], ["abed"], reference=["abcd"], mode="errors") == [-1.0]
    assert wer([None, None], ["", "a"], reference=["", ""], mode="negative") == [0.0, -1.0]


def test_wer_bad_mode_is_named():
    with pytest.raises(ValueError, match="mode='clipped'"):
        get_reward("wer")([None], ["a"], reference=["a"], mode="clipped")


def test_asr_wer_through_a_registered_transcriber_resamples_to_its_rate():
    """A transcriber that is not a Whisper (`register_transcriber`) gets the waveforms at its own rate,
    and its transcripts are scored like Whisper's."""
    from mmrl.rewards.wer import register_transcriber
    heard = []

    def transcribe(waves):
        heard.extend(len(w) for w in waves)
        return ["one two", "One, three!"]

    register_transcriber("test-transcriber", transcribe, 8000)
    clips = [{"array": np.zeros(16000, np.float32), "sampling_rate": 16000},
             {"array": np.zeros(4000, np.float32), "sampling_rate": 8000}, np.zeros(10, np.float32)]
    scores = W.asr_wer_reward(None, clips, ["one two", "one two", None], model="test-transcriber", sampling_rate=8000)
    assert heard == [8000, 4000]  # resampled to 8 kHz; the row without a reference is not transcribed
    assert scores == [1.0, 0.5, None]  # "one three" against "one two": one substitution in two words
