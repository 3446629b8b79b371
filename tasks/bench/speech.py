"""LibriSpeech test-clean and test-other word error rate, for audio LMs (docs/bench.md#librispeech).

Corpus WER = total word edits (S + D + I) / total reference words over the test set, not a mean of
per-utterance rates. Both sides pass Whisper's English text normaliser first (``normalizer``
"whisper", the default: the `whisper_normalizer` package's `EnglishTextNormalizer`, a copy of
openai/whisper's, as the Whisper paper and the Open ASR leaderboard score), or lmms-eval's
librispeech pipeline ("lmms_eval": its special-token and spacing clean-up, the English normaliser,
then the basic normaliser, punctuation-only tokens dropped). Edits are a Levenshtein alignment of
the word lists (jiwer). The prompt and greedy decoding of up to 256 tokens are lmms-eval's.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any, Mapping, Sequence

import jiwer

from mmrl.core.benchmark import Benchmark, Figure
from mmrl.core.scoring import register_reward
from mmrl.rewards.outputs import TEXT
from mmrl.registry import BENCHMARKS
from mmrl.rewards.text import completion_text

NORMALIZERS = ("whisper", "lmms_eval")
PROMPT = "Please recognize the speech and only output the recognized content:"


@lru_cache(maxsize=None)
def _normalizers():
    try:
        from whisper_normalizer.basic import BasicTextNormalizer
        from whisper_normalizer.english import EnglishTextNormalizer
    except ImportError as e:
        raise ImportError(f"the librispeech benchmarks need Whisper's normaliser ({e}): pip install whisper-normalizer") from None
    return EnglishTextNormalizer(), BasicTextNormalizer()


def normalized_words(text: str, normalizer: str = "whisper") -> list[str]:
    """The words of `text` after the normaliser `normalizer` (the module docstring)."""
    english, basic = _normalizers()
    if normalizer == "whisper":
        return english(text).split()
    if normalizer != "lmms_eval":
        raise ValueError(f"normalizer={normalizer!r} is not one of {NORMALIZERS}")
    text = re.sub(r"<\|.*?\|>", " ", text)
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r" ?([!,.?;:])", r"\1", text).lstrip(" ")
    words = basic(english(text)).lower().split(" ")
    return " ".join(w for w in words if not all(unicodedata.category(c)[0] == "P" for c in w)).split()


def word_edits(reference: list[str], hypothesis: list[str]) -> int:
    """S + D + I of the Levenshtein alignment of two word lists."""
    if not reference or not hypothesis:
        return len(reference) + len(hypothesis)
    out = jiwer.process_words(" ".join(reference), " ".join(hypothesis))
    return out.substitutions + out.deletions + out.insertions


@register_reward("transcript_edits", outputs=TEXT)
def transcript_edits(prompts, completions, reference, count: str = "edits",
                     normalizer: str | Sequence[str] = "whisper") -> list[float]:
    """Per sample, with ``count`` "edits" the word edits between the normalised completion and
    ``reference``, with "words" the normalised reference's word count (their sums give corpus WER);
    ``normalizer`` one for all, or per sample (the benchmark's option, as a column)."""
    if count not in ("edits", "words"):
        raise ValueError(f"transcript_edits: count={count!r} is not edits or words")
    norms = [normalizer] * len(completions) if isinstance(normalizer, str) else list(normalizer)
    out = []
    for c, r, norm in zip(completions, reference, norms):
        ref = normalized_words(str(r), norm)
        out.append(float(len(ref) if count == "words" else word_edits(ref, normalized_words(completion_text(c), norm))))
    return out


def _rows(source: Sequence[dict], options: Mapping[str, Any]) -> list[dict]:
    rows = []
    for n, row in enumerate(source):
        text = row.get("text", row.get("gt"))
        if not isinstance(text, str):
            raise ValueError(f"row {n}: no transcript in 'text' ({text!r})")
        rows.append({"id": str(row.get("id", n)), "audio": row["audio"], "reference": text,
                     "speaker": str(row.get("speaker_id", ""))})
    return rows


def _librispeech(subset: str) -> Benchmark:
    return Benchmark(
        name=f"librispeech_{subset}", source="openslr/librispeech_asr", subset=subset, split="test",
        description=f"LibriSpeech test-{subset}: corpus word error rate (%) after Whisper's English normaliser",
        read_rows=_rows, prompt=lambda row, options: options["prompt"], scorer="transcript_edits",
        metrics={"edits": {"count": "edits"}, "words": {"count": "words"}},
        figures={"wer": Figure("edits", per="words", scale=100.0, higher_is_better=False)}, headline="wer",
        default_task="audio_lm", official="Whisper's EnglishTextNormalizer (whisper-normalizer package) and jiwer's "
        "alignment; the corpus sum and the lmms-eval variant are mmrl's, tested against lmms-eval 0.7.3's compute_wer",
        policy={"audio_lm": {"max_new_tokens": 256, "audio_column": "audio"}},
        options={"prompt": PROMPT, "normalizer": "whisper"}, resolve_options=None)


for _subset in ("clean", "other"):
    BENCHMARKS.register(f"librispeech_{_subset}")(_librispeech(_subset))
