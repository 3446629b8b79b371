"""Reading a multiple-choice answer out of a response, as MMMU's evaluation does it (and MMAU's, which
lmms-eval takes from it with a narrower search), and MMMU's open-answer matching.

`choice_letter` looks, in order, for ``(A)``; for ``A`` followed by a space (MMAU: surrounded by
spaces); for ``A.``; for MMMU only and only in responses of more than five words, for an option's
text. Several found: the one written last. None found: the protocols draw a letter at random; here
the draw is seeded by the sample (`fallback_seed`), so a rerun scores the same.

`open_answer_correct` is MMMU's open question rule: the response's key phrases (per sentence, the
shortest text after "could be ", "so ", "is ", ..., "result ", or "=" in the last sentence, taken
in that order, an empty one giving way to the next) and every number in them, lower-cased, numbers
rounded to 2 places, must contain the normalised reference (a number equal to it).
"""

from __future__ import annotations

import random
import re
from typing import Sequence

STRIPPED = ",.!?;:'"
KEY_INDICATORS = ("could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result ")
TRIVIAL = {":", ",", ".", "!", "?", ";", "'"}
_NUMBER_FORMS = (r"-?\b\d{1,3}(?:,\d{3})+\b", r"-?\d+(?:\.\d+)?[eE][+-]?\d+",
                 r"-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d])")


def letters_for(options: Sequence[str]) -> dict[str, str]:
    """letter -> option text, from A."""
    return {chr(ord("A") + i): str(option) for i, option in enumerate(options)}


def _candidates(response: str, letters: dict[str, str], style: str) -> tuple[list[str], str]:
    """The letters found and how (bracket, letter, text)."""
    found = [c for c in letters if f"({c})" in response]
    if found:
        return found, "bracket"
    spaced = (lambda c: f" {c} ") if style == "mmau" else (lambda c: f"{c} ")
    found = [c for c in letters if spaced(c) in response] or [c for c in letters if f"{c}." in response]
    if found:
        return found, "letter"
    if style == "mmmu" and len(response.split()) > 5:
        return [c for c, text in letters.items() if text.lower() in response.lower()], "text"
    return [], "letter"


def choice_letter(response: str, letters: dict[str, str], fallback_seed: int, style: str = "mmmu") -> str:
    """The letter the response chooses (module docstring); `style` "mmmu" or "mmau"."""
    response = f" {response.strip(STRIPPED)} "
    found, how = _candidates(response, letters, style)
    if not found:
        return random.Random(fallback_seed).choice(sorted(letters))
    if len(found) == 1:
        return found[0]
    if how == "text":
        where = {c: response.lower().rfind(letters[c].lower()) for c in found}
    elif how == "bracket" and style == "mmmu":
        where = {c: response.rfind(f"({c})") for c in found}
    else:
        where = {c: response.rfind(f" {c} ") for c in found}
    return max(found, key=lambda c: (where[c], -found.index(c)))  # the first of equal positions, as argmax


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def normalized_forms(text: str) -> list[str | float]:
    """A number rounded to 2 places; text lower-cased (one character padded with a space on either side)."""
    text = text.strip()
    number = _number(text)
    if number is not None:
        return [round(number, 2)]
    text = text.lower()
    return [" " + text, text + " "] if len(text) == 1 else [text]


def _key_phrases(response: str) -> list[str]:
    sentences = re.split(r"\.\s(?=[A-Z])|\n", response.strip().strip(".").lower())
    phrases = []
    for n, sentence in enumerate(sentences):
        indicators = KEY_INDICATORS + (("=",) if n == len(sentences) - 1 else ())
        shortest = ""
        for tail in (sentence.split(ind)[-1].strip() for ind in indicators if ind in sentence):
            if not shortest or len(tail) < len(shortest):  # an empty tail is replaced by the next, as MMMU's code does
                shortest = tail
        if shortest and shortest.strip() not in TRIVIAL:
            phrases.append(shortest)
    return phrases or [response.strip().strip(".").lower()]


def open_predictions(response: str) -> list[str | float]:
    """The response's key phrases and their numbers, normalised (MMMU's parse of an open answer)."""
    phrases = _key_phrases(response)
    numbers = [m for p in phrases for form in _NUMBER_FORMS for m in re.findall(form, p)]
    return list({form for item in [*phrases, *numbers] for form in normalized_forms(item)})


def open_answer_correct(response: str, answers: str | Sequence[str]) -> bool:
    """Whether a normalised reference (any of a list) is in a predicted phrase, or equals a predicted number."""
    references = [f for a in ([answers] if isinstance(answers, str) else answers) for f in normalized_forms(str(a))]
    for pred in open_predictions(response):
        if isinstance(pred, str):
            if any(isinstance(r, str) and r in pred for r in references):
                return True
        elif pred in references:
            return True
    return False
