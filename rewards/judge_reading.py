"""How a served judge's answer becomes a number (`Reading`; docs/rewards.md#judges).

The judge's own text is the answer's content after any echo of the user message it was sent
(`own_text`: some servers repeat the prompt, e.g. `transformers serve` with a chat template its
response parser does not know), so a number in the template is never read as the judge's.

``parse: regex``: `pattern` is searched in that text; the score is the first group of the match
that took part in it (the whole match if it has no group), of the last match (`judge`: a final
``Score: N``) or of the first (`judge_pairwise`: Pref-GRPO's first ``<answer>``). The default
score pattern (`SCORE_PATTERN`) matches only where a judge is told to put its score: a line
``Score: N`` (markdown emphasis allowed) or a last line that is the score alone; a number anywhere
else in prose is not a score. A score's text reads as a number or as a ratio (``7/10``, ``7 out
of 10``: 7, its denominator the top of `score_range` when one is given, never below the
numerator); anything else, or a number outside `score_range`, is unreadable (None), never clipped.
Pairwise, the matched text is looked up in `verdicts` (p(first wins) of the first key, in the
recipe's order, that it contains as a whole word or phrase: Pref-GRPO checks "Image 1 is better"
then "Image 2 is better"); a match that names no verdict counts `tie` (0.5: Pref-GRPO's tie; None:
unreadable).

``parse: yes_probability``: Flow-Factory's ``P(Yes) / (P(Yes) + P(No))`` over the first answer
token's ``top_logprobs`` (`yes_tokens` / `no_tokens`, compared after stripping spaces).
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, Sequence

from mmrl.errors import UserError

Parse = Literal["regex", "yes_probability"]
SCORE = r"[-+]?\d+(?:\.\d+)?(?:[ \t]*(?:/|out[ \t]+of)[ \t]*\d+(?:\.\d+)?)?"  # 7, 7.5, 7/10, 7 out of 10
SCORE_PATTERN = (rf"(?im)^[ \t>#*_-]*(?:\w+[ \t]+)?score[ \t*_]*[:=][ \t*_]*({SCORE})[ \t*_.]*$"  # a line "Score: 7" / "**Score:** 7/10"
                 rf"|^[ \t*_]*({SCORE})[ \t*_.]*\s*\Z")  # the answer's last line is the score alone
ANSWER_PATTERN = r"(?s)<answer>(.*?)</answer>"  # Pref-GRPO's _extract_answer (its first match)
PREF_GRPO_VERDICTS = {"Image 1 is better": 1.0, "Image 2 is better": 0.0}  # their better_1 / better_2 (images)
RATIO = re.compile(r"\s*([-+]?\d+(?:\.\d+)?)\s*(?:(?:/|out\s+of)\s*(\d+(?:\.\d+)?))?\s*\.?\s*", re.IGNORECASE)


def own_text(answer: str, sent: str) -> str:
    """`answer` after the first place that holds the whole of `sent` (whitespace aside: a server's
    decode may drop or add spaces), or `answer` itself when it holds no echo of it."""
    needle = "".join(sent.split())
    if not needle:
        return answer
    kept = [i for i, ch in enumerate(answer) if not ch.isspace()]
    at = "".join(answer[i] for i in kept).find(needle)
    return answer if at < 0 else answer[kept[at + len(needle) - 1] + 1:]


def score_value(text: str, score_range: Sequence[float] | None) -> float | None:
    """The score `text` gives (a number, or a ratio's numerator), or None when it gives none that
    lies in `score_range`."""
    found = RATIO.fullmatch(text)
    if found is None:
        return None
    value = float(found.group(1))
    low, high = score_range or (-math.inf, math.inf)
    if found.group(2) is not None:  # N/D or N out of D
        top = float(found.group(2))
        if value > top or (score_range is not None and top != high):
            return None
    return value if math.isfinite(value) and low <= value <= high else None


def word_pattern(phrase: str) -> re.Pattern:
    """`phrase` as a whole word or phrase: not continuing a word before or after it ("1" is not
    found in "12", nor "A" in "Answer")."""
    before = r"(?<!\w)" if re.match(r"\w", phrase) else ""
    after = r"(?!\w)" if re.search(r"\w\Z", phrase) else ""
    return re.compile(before + re.escape(phrase) + after)


class Reading:
    """How an answer becomes a number (the module docstring), checked when built. `take`: which
    match of `pattern` counts, the last (a judge's final score) or the first (Pref-GRPO's)."""

    def __init__(self, reward: str, parse: Parse, pattern: str, score_range: Sequence[float] | None,
                 verdicts: dict[str, float] | None, yes_tokens: Sequence[str], no_tokens: Sequence[str],
                 tie: float | None = None, take: Literal["first", "last"] = "last"):
        key = f"rewards.{reward}.args"
        if parse not in ("regex", "yes_probability"):
            raise UserError(f"{key}.parse={parse!r}: choose regex or yes_probability")
        try:
            self.pattern = re.compile(pattern)
        except re.error as e:
            raise UserError(f"{key}.pattern={pattern!r} is not a regular expression: {e}") from None
        if score_range is not None and (len(score_range) != 2 or not score_range[0] < score_range[1]):
            raise UserError(f"{key}.score_range={score_range!r}: give [low, high] with low < high")
        if verdicts is not None and not all(0.0 <= float(p) <= 1.0 for p in verdicts.values()):
            raise UserError(f"{key}.verdicts={verdicts!r}: each verdict's value is p(first wins), in [0, 1]")
        if verdicts is not None and not all(str(k) for k in verdicts):
            raise UserError(f"{key}.verdicts={verdicts!r}: a verdict is a non-empty phrase")
        if tie is not None and not 0.0 <= float(tie) <= 1.0:
            raise UserError(f"{key}.tie={tie!r}: p(first wins) of an answer naming no verdict, in [0, 1] (or null)")
        self.parse, self.score_range, self.tie, self.take = parse, score_range, tie, take
        self.verdicts = None if verdicts is None else [(word_pattern(str(k)), float(p)) for k, p in verdicts.items()]
        self.yes, self.no = {t.strip() for t in yes_tokens}, {t.strip() for t in no_tokens}

    def body(self, model: str, messages: list[dict], max_tokens: int, temperature: float, top_logprobs: int) -> dict:
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        if self.parse == "yes_probability":
            body.update(max_tokens=1, logprobs=True, top_logprobs=top_logprobs)
        return body

    def read(self, choice: dict[str, Any], sent: str = "") -> float | None:
        """The number of the answer `choice` to the user message `sent`, or None when it cannot be read."""
        if self.parse == "yes_probability":
            content = (choice.get("logprobs") or {}).get("content") or [{}]
            top = content[0].get("top_logprobs") or []
            p_yes = sum(math.exp(t["logprob"]) for t in top if t["token"].strip() in self.yes)
            p_no = sum(math.exp(t["logprob"]) for t in top if t["token"].strip() in self.no)
            return p_yes / (p_yes + p_no) if p_yes + p_no > 0 else None
        text = own_text(str((choice.get("message") or {}).get("content") or ""), sent)
        matches = list(self.pattern.finditer(text))
        if not matches:
            return None
        match = matches[0] if self.take == "first" else matches[-1]
        found = next((g for g in match.groups() if g is not None), match.group(0))
        if self.verdicts is None:
            return score_value(found, self.score_range)
        return next((p for phrase, p in self.verdicts if phrase.search(found)), self.tie)


def sent_text(body: dict[str, Any]) -> str:
    """The text of the last message of a chat request `body` (the filled template)."""
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else " ".join(p["text"] for p in content if p.get("type") == "text")
