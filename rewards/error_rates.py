"""Transcript error rates, what the ``wer``, ``cer`` and ``asr_wer`` rewards (`wer.py`) score with:
transcript normalisation (`normalize_transcript`, numbers spelled out by `number_to_words`), and
word and character error rates of one pair or of many pairs in one alignment call.

Error rates (jiwer, Levenshtein alignment): ``WER = (S + D + I) / N`` with S substitutions,
D deletions, I insertions and N reference words; CER is the same over characters (spaces
included). Both can exceed 1 when the hypothesis has many insertions.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Sequence

import jiwer

# -- normalisation -------------------------------------------------------------------------------

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u2032": "'"})
_NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(?![\w]|[.,]\d)")


def number_to_words(n: int) -> str:
    """English words for 0 <= n <= 999999, without "and" or hyphens: 21 -> "twenty one",
    105 -> "one hundred five", 12000 -> "twelve thousand"."""
    if not 0 <= n <= 999_999:
        raise ValueError(f"number_to_words: n={n!r} is outside 0..999999")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_to_words(n % 100))
    return number_to_words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + number_to_words(n % 1000))


def _spell_number(m: re.Match) -> str:
    n = int(m.group(1).replace(",", ""))
    return number_to_words(n) if n <= 999_999 else m.group(0)


def normalize_transcript(text: str, lowercase: bool = True, strip_punctuation: bool = True,
                         numbers_to_words: bool = False) -> str:
    """Normalise a transcript before scoring.

    Always: Unicode NFKC, typographic apostrophes to ``'``, whitespace collapsed and stripped.
    ``lowercase``: casefold. ``numbers_to_words``: whole-word digit runs 0..999999 (also
    ``1,000``-style groups; leading zeros ignored) spelled out in English, ``"21"`` ->
    ``"twenty one"``; larger numbers, decimals and digits glued to letters (``3rd``) are left as
    they are. ``strip_punctuation``: hyphens and dashes become spaces, other punctuation (Unicode
    category P*) is removed, except an apostrophe between two letters/digits (``"don't"``).
    """
    if not isinstance(text, str):
        raise ValueError(f"normalize_transcript: text={text!r:.80} is not a string")
    text = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES)
    if lowercase:
        text = text.lower()
    if numbers_to_words:
        text = _NUMBER.sub(_spell_number, text)
    if strip_punctuation:
        chars = []
        for i, ch in enumerate(text):
            cat = unicodedata.category(ch)
            if ch == "'" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum():
                chars.append(ch)
            elif cat == "Pd":  # hyphens and dashes separate words
                chars.append(" ")
            elif cat.startswith("P"):
                chars.append("")
            else:
                chars.append(ch)
        text = "".join(chars)
    return " ".join(text.split())


# -- error rates ---------------------------------------------------------------------------------

def _error_rate(measure, reference: str, hypothesis: str, norm: dict) -> float:
    ref = normalize_transcript(reference, **norm)
    hyp = normalize_transcript(hypothesis, **norm)
    if not ref:  # undefined (N = 0): every hypothesis token is an insertion; capped at 1
        return 0.0 if not hyp else 1.0
    if not hyp:  # every reference token is a deletion
        return 1.0
    return float(measure(ref, hyp))


def word_error_rate(reference: str, hypothesis: str, **norm: Any) -> float:
    """WER = (S + D + I) / N over the normalised texts (``norm``: the `normalize_transcript`
    options), via ``jiwer.wer``. An empty reference gives 0.0 for an empty hypothesis and 1.0
    otherwise (every hypothesis word is an insertion; we cap at 1)."""
    return _error_rate(jiwer.wer, reference, hypothesis, norm)


def char_error_rate(reference: str, hypothesis: str, **norm: Any) -> float:
    """CER = (S + D + I) / N over the characters of the normalised texts (spaces count), via
    ``jiwer.cer``; empty references as in `word_error_rate`."""
    return _error_rate(jiwer.cer, reference, hypothesis, norm)


def edit_counts(references: Sequence[str], hypotheses: Sequence[str], unit: str = "word",
                **norm: Any) -> list[tuple[int, int]]:
    """Per pair (S + D + I, N) over the normalised texts, N the number of reference units
    (words, or characters with spaces), with one alignment call."""
    refs = [normalize_transcript(r, **norm) for r in references]
    hyps = [normalize_transcript(h, **norm) for h in hypotheses]
    split = str.split if unit == "word" else list
    # an empty side: every hypothesis unit is an insertion / every reference unit a deletion
    out = [(len(split(h)) if not r else len(split(r)), len(split(r))) for r, h in zip(refs, hyps)]
    both = [i for i, (r, h) in enumerate(zip(refs, hyps)) if r and h]
    if both:
        process = jiwer.process_words if unit == "word" else jiwer.process_characters
        aligned = process([refs[i] for i in both], [hyps[i] for i in both])
        for i, chunks, ref_units in zip(both, aligned.alignments, aligned.references):
            errors = sum(max(c.ref_end_idx - c.ref_start_idx, c.hyp_end_idx - c.hyp_start_idx)
                         for c in chunks if c.type != "equal")
            out[i] = (errors, len(ref_units))
    return out


def error_rates(references: Sequence[str], hypotheses: Sequence[str], unit: str = "word",
                **norm: Any) -> list[float]:
    """Per-pair (S + D + I) / N for many pairs with ONE alignment call (``jiwer.process_words``
    or ``process_characters``); empty references or hypotheses as in `word_error_rate`."""
    return [errors / n if n else min(float(errors), 1.0)
            for errors, n in edit_counts(references, hypotheses, unit, **norm)]
