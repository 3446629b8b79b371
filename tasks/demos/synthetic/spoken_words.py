"""Synthetic speech for the ASR demo: spoken digit words as sine-wave speech, made in code (and the
same words as text to say, for text-to-speech: `words_to_say`).

Sine-wave speech (Remez et al., Science 1981) replaces a voice by a few sine tones that follow
its formants; listeners still understand it. Here each word of the vocabulary ("zero" ..
"seven") is two vowel-like syllables, and a syllable is two sine tones at the first two formants
of a vowel (Peterson & Barney 1952 averages for a, e, i, o, u), with a raised-cosine envelope;
every word has its own ordered vowel pair. An utterance is 1-3 words with short pauses, a random
speaking rate, pitch shift and loudness, and a little noise.

Why this and not espeak-ng: the demo must show a *tiny* random Qwen2-Audio (1-layer encoder)
learning to transcribe within minutes on CPU. Formant tones are sharp lines in the 128-bin mel
spectrogram, so a word is learnable from a few examples, while espeak-ng's buzzy formant
synthesis needs far more model and data; and code needs no Debian package on the CI machine.
The structure ASR rewards care about is kept: variable-length word sequences, a transcript to
score by WER, partial credit for partly right transcripts.
"""

from __future__ import annotations

import random

import numpy as np

from mmrl.registry import DATASETS

RATE = 16000
VOWELS = {"a": (730, 1090), "e": (530, 1840), "i": (270, 2290), "o": (570, 840), "u": (300, 870)}
WORDS = {"zero": "io", "one": "ua", "two": "uu", "three": "ie", "four": "oa", "five": "ai", "six": "ii",
         "seven": "ee"}


def syllable(vowel: str, seconds: float, shift: float) -> np.ndarray:
    """Two sine tones at the vowel's formants (scaled by `shift`), under a raised-cosine envelope."""
    t = np.arange(int(RATE * seconds)) / RATE
    f1, f2 = (f * shift for f in VOWELS[vowel])
    envelope = 0.5 - 0.5 * np.cos(2 * np.pi * t / seconds)
    return envelope * (0.6 * np.sin(2 * np.pi * f1 * t) + 0.4 * np.sin(2 * np.pi * f2 * t))


def utterance(words: list[str], rng: random.Random) -> np.ndarray:
    """The words as sine-wave speech at 16 kHz: a speaking rate, pitch shift and loudness per
    utterance, pauses between words, noise at about -40 dB."""
    for w in words:
        if w not in WORDS:
            raise ValueError(f"speech: word {w!r} is not in the vocabulary {sorted(WORDS)}")
    rate, shift, loud = rng.uniform(0.85, 1.15), rng.uniform(0.95, 1.05), rng.uniform(0.2, 0.4)
    pause = np.zeros(int(RATE * 0.08 * rate))
    parts = [pause]
    for w in words:
        parts += [syllable(v, 0.11 * rate, shift) for v in WORDS[w]] + [pause]
    clip = loud * np.concatenate(parts)
    noise = np.random.default_rng(rng.getrandbits(32)).standard_normal(len(clip)) * 0.003
    return (clip + noise).astype(np.float32)


@DATASETS.register("spoken_words")
def spoken_words(n_train: int = 2000, n_eval: int = 64, min_words: int = 1, max_words: int = 3, seed: int = 0):
    """Rows: {"prompt", "audio": {"array", "sampling_rate"}, "reference": the transcript,
    "target": the SFT answer (the transcript)}."""
    if not 1 <= min_words <= max_words:
        raise ValueError(f"spoken_words: need 1 <= min_words ({min_words}) <= max_words ({max_words})")
    rng = random.Random(seed)
    vocab = sorted(WORDS)

    def rows(n: int) -> list[dict]:
        out = []
        for _ in range(n):
            words = [rng.choice(vocab) for _ in range(rng.randint(min_words, max_words))]
            text = " ".join(words)
            out.append({"prompt": "Transcribe the speech.", "audio": {"array": utterance(words, rng),
                                                                        "sampling_rate": RATE},
                        "reference": text, "target": text})
        return out

    return {"train": rows(n_train), "eval": rows(n_eval)}



@DATASETS.register("words_to_say")
def words_to_say(n_train: int = 256, n_eval: int = 16, min_words: int = 1, max_words: int = 3, seed: int = 0):
    """Text-to-speech rows of the same vocabulary: {"prompt": the words to say, "reference": the same
    words, what an ASR judge's transcript is scored against}."""
    if not 1 <= min_words <= max_words:
        raise ValueError(f"words_to_say: need 1 <= min_words ({min_words}) <= max_words ({max_words})")
    rng = random.Random(seed)
    vocab = sorted(WORDS)

    def rows(n: int) -> list[dict]:
        texts = (" ".join(rng.choice(vocab) for _ in range(rng.randint(min_words, max_words))) for _ in range(n))
        return [{"prompt": text, "reference": text} for text in texts]

    return {"train": rows(n_train), "eval": rows(n_eval)}

def draw_predictions(rows: list[dict], before: list[str], after: list[str], out_png) -> None:
    """Each held-out clip's spectrogram with its transcript and the greedy transcripts before and
    after RL."""
    from ..figures import draw_transcripts, spectrogram_image
    draw_transcripts([spectrogram_image(r["audio"]["array"], r["audio"]["sampling_rate"]) for r in rows], [r["reference"] for r in rows],
                     before, after, out_png)
