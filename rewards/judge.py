"""Judges behind OpenAI-compatible servers (`vllm serve`, SGLang, `transformers serve`): ``judge``
scores each row, ``judge_pairwise`` each row's win rate within its prompt group.

Each question is one ``POST URL/v1/chat/completions`` through the served rewards' transport
(``rewards.NAME.url`` and ``client``: batching into concurrent requests, timeout, retries, cache,
record / replay, ``on_failure``). The user message is `template` with ``{prompt}``,
``{completion}`` (pairwise: ``{completion_a}``, ``{completion_b}``) and any data column by name
filled in, after the images `images` names ("completion": the generated image or video frames; a
column name: that column's) as base64 PNG ``image_url`` parts.

Reading the answer (`judge_reading.Reading`): ``regex`` reads a score only where the template asks
for it (by default a ``Score: N`` line or a last line that is the score alone; a ratio ``7/10``
reads 7), never in an echo of the prompt; ``yes_probability`` is Flow-Factory's P(Yes). An answer
that cannot be read is never a number: it is counted in ``reward/NAME/unparsed_frac`` and, like a
failed request, stops the step (``on_failure: stop``) or leaves its rows without this reward
(``skip``). Pairwise (Pref-GRPO's ``_pairwise_win_rate``), every pair of the group is asked once
(``pairs: once``) or in both orders (``both``), the first ``<answer>`` is read for "Image 1 is
better" / "Image 2 is better" (`verdicts`), an answer naming neither is a tie (0.5 each), and the
win rates are counted as `win_rate.win_rates` counts them, rounded to `decimals` (3, as the
authors); a group with a pair that got no readable answer gets no reward. docs/rewards.md#judges."""

from __future__ import annotations

import base64
import difflib
import functools
import inspect
import io
import string
from itertools import combinations
from typing import Any, Literal, Sequence

import numpy as np

from mmrl.core.scoring import register_reward
from mmrl.errors import UserError
from mmrl.serving.remote_reward import SENDS_OWN_REQUESTS, RemoteRewardError, stop_unless_skipped
from mmrl.serving.transport import Answer, Failure, Transport
from .judge_reading import ANSWER_PATTERN, PREF_GRPO_VERDICTS, SCORE_PATTERN, Parse, Reading, own_text, sent_text
from .win_rate import win_rates

CHAT_PATH = "/v1/chat/completions"


def image_parts(value: Any) -> list[dict[str, Any]]:
    """``image_url`` content parts of an image, of video frames (a list, or an array [F, H, W, C])."""
    if isinstance(value, (list, tuple)):
        return [part for v in value for part in image_parts(v)]
    if isinstance(value, np.ndarray) and value.ndim == 4:
        return [part for frame in value for part in image_parts(frame)]
    from PIL import Image
    image = Image.fromarray(np.asarray(value, dtype=np.uint8)) if isinstance(value, np.ndarray) else value
    if not hasattr(image, "save"):
        raise UserError(f"a judge's images must be PIL images, frames or uint8 arrays; got {type(value).__name__}")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()}}]


def user_message(reward: str, template: str, fields: dict[str, Any], images: list[Any]) -> dict[str, Any]:
    """The user turn: the images, then `template` filled from `fields`."""
    try:
        text = template.format_map(fields)
    except KeyError as e:
        raise UserError(f"rewards.{reward}.args.template names {{{e.args[0]}}}, which is not one of "
                        f"{', '.join(sorted(fields))}") from None
    parts = [part for value in images for part in image_parts(value)]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}] if parts else text}


def ask(reward: str, transport: Transport | None, reading: Reading, bodies: list[dict], spans: list[list[int]],
        total: int, group_ids: Sequence[int] | None) -> list[float | str]:
    """Each question's number, or ``"failed"`` / ``"unparsed"`` where its request failed or its answer
    could not be read (each stops the step unless on_failure is skip)."""
    if transport is None:
        raise UserError(f"rewards.{reward}.url: a judge needs the url of an OpenAI-compatible server "
                        f"(or rewards.{reward}.replay)")
    on_failure = transport.settings.on_failure
    out: list[float | str] = []
    for span, body, answer in zip(spans, bodies, transport.send(CHAT_PATH, bodies)):
        if isinstance(answer, Failure):
            stop_unless_skipped(reward, on_failure, answer, span, total, group_ids)
            out.append("failed")
            continue
        value = reading.read(first_choice(reward, answer), sent_text(body))
        if value is None:
            unreadable(reward, on_failure, answer, span, total, sent_text(body))
        out.append("unparsed" if value is None else value)
    return out


def first_choice(reward: str, answer: Answer) -> dict[str, Any]:
    choices = answer.value.get("choices") if isinstance(answer.value, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise RemoteRewardError(f"reward {reward!r}: {answer.source} answered {str(answer.value)[:120]!r}, not a "
                                "chat completion with choices")
    return choices[0]


def unreadable(reward: str, on_failure: str, answer: Answer, span: list[int], total: int, sent: str) -> None:
    """Raise for an answer the parser cannot read unless on_failure is skip (naming the judge's own
    text: the answer after any echo of the user message `sent`)."""
    if on_failure == "skip":
        return
    choice = answer.value["choices"][0]
    text = own_text(str((choice.get("message") or {}).get("content")), sent)
    raise RemoteRewardError(f"reward {reward!r}: {answer.source} answered {text[:80]!r} for rows "
                            f"{min(span)}-{max(span)} of {total}, which rewards.{reward}.args (parse, pattern, "
                            "score_range, verdicts, yes_tokens / no_tokens) cannot read as a score, so the step "
                            f"did not train (rewards.{reward}.client.on_failure=stop; skip trains those rows "
                            "without this reward)")


def template_fields(prompts, completions, columns: dict[str, Sequence[Any]], i: int) -> dict[str, Any]:
    return {**{k: v[i] for k, v in columns.items()}, "prompt": prompts[i], "completion": completions[i]}


def row_images(reward: str, images: Sequence[str], completions, columns, i: int) -> list[Any]:
    """Row i's images: the completion's, or a column's (an absent column is an error naming it)."""
    missing = [name for name in images if name != "completion" and name not in columns]
    if missing:
        raise UserError(f"rewards.{reward}.args.images names {missing[0]!r}, which is neither 'completion' nor a "
                        f"column of the rows ({', '.join(sorted(columns))})")
    return [completions[i] if name == "completion" else columns[name][i] for name in images]


def field_problems(reward: str, fixed: Sequence[str], columns: Sequence[str], template: str = "",
                   images: Sequence[str] = (), **args) -> list[str]:
    """The template's fields and the `images` the rows will not have (`columns`: every column the
    reward sees), checked with the data before any model loads (``check_column_names``)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    except ValueError:  # a malformed template: `args_problems` names it
        return []
    names = dict.fromkeys(f.split(".")[0].split("[")[0] for f in fields)
    unknown = [(f"template names {{{n}}}", n, fixed) for n in names if n not in (*fixed, *columns)]
    unknown += [(f"images names {n!r}", n, ("completion",)) for n in images if n not in ("completion", *columns)]
    problems = []
    for what, name, own in unknown:
        close = difflib.get_close_matches(name, [*own, *columns], n=1)
        problems.append(f"rewards.{reward}.args.{what}, which is neither {' nor '.join(own)} nor a column of the rows "
                        f"({', '.join(sorted(columns))})" + (f"; did you mean {close[0]!r}?" if close else ""))
    return problems


@register_reward("judge", check_column_names=functools.partial(field_problems, "judge", ("prompt", "completion")))
def judge(prompts, completions, template: str, model: str = "judge", parse: Parse = "regex",
          pattern: str = SCORE_PATTERN, score_range: list[float] | None = None, yes_tokens: Sequence[str] = ("Yes",),
          no_tokens: Sequence[str] = ("No",), top_logprobs: int = 20, images: Sequence[str] = (),
          system: str = "", max_tokens: int = 256, temperature: float = 0.0, *, transport: Transport | None = None,
          log_metric=None, **columns):
    """Each completion's score from the judge (the module docstring)."""
    reading = Reading("judge", parse, pattern, score_range, None, yes_tokens, no_tokens)
    head = [{"role": "system", "content": system}] if system else []
    bodies = [reading.body(model, [*head, user_message("judge", template, template_fields(
        prompts, completions, columns, i), row_images("judge", images, completions, columns, i))],
        max_tokens, temperature, top_logprobs) for i in range(len(completions))]
    answers = ask("judge", transport, reading, bodies, [[i] for i in range(len(completions))], len(completions),
                  columns.get("group_id"))
    count_rows(log_metric, answers)
    return [None if isinstance(a, str) else a for a in answers]


@register_reward("judge_pairwise", per_group=True, check_column_names=functools.partial(
    field_problems, "judge_pairwise", ("prompt", "completion", "completion_a", "completion_b")))
def judge_pairwise(prompts, completions, template: str, model: str = "judge", parse: Parse = "regex",
                   pattern: str = ANSWER_PATTERN, verdicts: dict[str, float] | None = None, tie: float | None = 0.5,
                   yes_tokens: Sequence[str] = ("Yes",), no_tokens: Sequence[str] = ("No",), top_logprobs: int = 20,
                   images: Sequence[str] = (), system: str = "", max_tokens: int = 256, temperature: float = 0.0,
                   pairs: Literal["once", "both"] = "once", decimals: int | None = 3, *,
                   transport: Transport | None = None, log_metric=None, **columns):
    """Each completion's win rate within its prompt group, the judge asked about each pair (the
    module docstring); `template` fills {completion_a} and {completion_b}."""
    verdicts = PREF_GRPO_VERDICTS if parse == "regex" and verdicts is None else verdicts
    reading = Reading("judge_pairwise", parse, pattern, None, verdicts, yes_tokens, no_tokens, tie, take="first")
    n = len(completions)
    if n < 2:
        return [None] * n
    asked = [*combinations(range(n), 2)]
    asked += [(j, i) for i, j in asked] if pairs == "both" else []
    head = [{"role": "system", "content": system}] if system else []
    bodies = []
    for i, j in asked:
        fields = {**template_fields(prompts, completions, columns, i), "completion_a": completions[i],
                  "completion_b": completions[j]}
        shown = [*row_images("judge_pairwise", images, completions, columns, i),
                 *row_images("judge_pairwise", images, completions, columns, j)]
        bodies.append(reading.body(model, [*head, user_message("judge_pairwise", template, fields, shown)],
                                   max_tokens, temperature, top_logprobs))
    answers = ask("judge_pairwise", transport, reading, bodies, [list(pair) for pair in asked], n,
                  columns.get("group_id"))
    lost = [a for a in answers if isinstance(a, str)]
    if lost:  # no win rate without every pair: the group's rows are lost as its worst pair was
        count_rows(log_metric, ["unparsed" if "unparsed" in lost else "failed"] * n)
        return [None] * n
    p = dict(zip(asked, answers))
    count_rows(log_metric, [0.0] * n)
    return win_rates(range(n), lambda a, b: p[(a, b)], pairs, decimals)


def count_rows(log_metric, outcomes: list[float | str]) -> None:
    """``sent_rows``, ``failed_rows`` and ``unparsed_rows`` (reward/NAME/failed_frac, unparsed_frac)."""
    if log_metric is not None:
        log_metric("sent_rows", len(outcomes))
        log_metric("failed_rows", outcomes.count("failed"))
        log_metric("unparsed_rows", outcomes.count("unparsed"))


def args_problems(reward: str, defaults: dict[str, Any], args: dict[str, Any]) -> list[str]:
    """What is wrong with ``rewards.NAME.args`` of a judge, found before any model loads."""
    given = {**defaults, **args}
    if "template" not in args:
        return [f"rewards.{reward}.args.template is missing: the judge's user message"]
    try:
        Reading(reward, given["parse"], given["pattern"], given.get("score_range"), given.get("verdicts"),
                given["yes_tokens"], given["no_tokens"], given.get("tie"))
        list(string.Formatter().parse(args["template"]))  # a ValueError for a malformed template
    except UserError as e:
        return [str(e)]
    except ValueError as e:
        return [f"rewards.{reward}.args.template={args['template']!r} is not a template: {e}"]
    return []


for _judge in (judge, judge_pairwise):
    setattr(_judge, SENDS_OWN_REQUESTS, True)
    _defaults = {k: p.default for k, p in inspect.signature(_judge).parameters.items() if p.default is not p.empty}
    _judge.args_problems = functools.partial(args_problems, _judge.__name__, _defaults)
