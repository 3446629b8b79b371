"""A registered reward scored by its server (``rewards.NAME.url``, `mmrl serve-reward NAME`): the
same columns in, the same ``list[float | None]`` out as the reward in process.

What is sent to ``POST /score``: ``{"prompts", "completions", "columns": {the columns the reward
takes, or all of them when it takes **kwargs}, "args": rewards.NAME.args}`` (`wire` encodes
images, arrays and audio), at most ``client.batch_size`` rows a request (whole prompt groups for a
reward that scores groups, `group_rewards`, which the server calls once per group). What comes back:
``{"rewards": [float | null, ...], "metrics": {key: count}}``; an answer of the wrong length, a
value that is not a number or null, or a NaN is an error naming the server. A request that fails
(`transport`) stops the step, or with ``client.on_failure: skip`` leaves its rows without this
reward, counted in ``reward/NAME/failed_rows`` of ``reward/NAME/sent_rows``."""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Sequence

from mmrl.core.group_rewards import rows_by_group, scores_groups
from mmrl.core.scoring import ColumnBoundReward, get_reward
from mmrl.errors import UserError
from mmrl.serving.server_directory import ServerSlot
from mmrl.serving.transport import Answer, Failure, Transport
from mmrl.serving.wire import encode

SCORE_PATH = "/score"
SENDS_OWN_REQUESTS = "sends_own_requests"  # set on a reward that is given the transport itself (a judge)


class RemoteRewardError(UserError):
    """A served reward that failed (with on_failure stop) or answered what is not a reward."""


class RemoteReward:
    """The reward `name` (whose local function `local` gives the signature: the columns it takes)
    scored through `transport` (its settings' on_failure applies), with `args` sent along."""

    def __init__(self, name: str, local: Callable[..., Any], transport: Transport, args: dict[str, Any]):
        self.name, self.transport, self.args = name, transport, dict(args)
        params = [p for p in inspect.signature(local).parameters.values()
                  if p.name not in ("log_metric", *self.args)]
        self.takes_all = any(p.kind == p.VAR_KEYWORD for p in params)
        self.per_group = scores_groups(local)  # the server calls it per group: requests hold whole groups
        self.taken = {p.name for p in params if p.kind != p.VAR_KEYWORD} - {"prompts", "completions"}
        self.taken |= {"group_id"} if self.per_group else set()
        logger = inspect.Parameter("log_metric", inspect.Parameter.KEYWORD_ONLY, default=None)
        at = next((k for k, p in enumerate(params) if p.kind == p.VAR_KEYWORD), len(params))
        self.__signature__ = inspect.Signature([*params[:at], logger, *params[at:]])
        self.__name__ = f"remote_{getattr(local, '__name__', name)}"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], log_metric=None, **columns):
        sent = {k: v for k, v in columns.items() if self.takes_all or k in self.taken}
        spans = self._spans(len(completions), columns.get("group_id") if self.per_group else None)
        bodies = [{"prompts": encode([prompts[i] for i in span]), "completions": encode([completions[i] for i in span]),
                   "columns": {k: encode([v[i] for i in span]) for k, v in sent.items()}, "args": encode(self.args)}
                  for span in spans]
        values: list[float | None] = []
        failed = 0
        for span, answer in zip(spans, self.transport.send(SCORE_PATH, bodies)):
            if isinstance(answer, Failure):
                stop_unless_skipped(self.name, self.transport.settings.on_failure, answer, span, len(completions),
                                    columns.get("group_id"))
                values += [None] * len(span)
                failed += len(span)
                continue
            values += self._read(answer, len(span))
            for key, count in (answer.value.get("metrics") or {}).items():
                if log_metric is not None:
                    log_metric(key, count)
        if log_metric is not None:
            log_metric("sent_rows", len(completions))
            log_metric("failed_rows", failed)
        return values

    def _spans(self, rows: int, group_id: Sequence[int] | None) -> list[list[int]]:
        """The rows of each request: at most batch_size, or with `group_id` whole groups packed up to
        batch_size rows (a larger group alone)."""
        size = max(1, self.transport.settings.batch_size)
        if group_id is None:
            return [list(range(i, min(i + size, rows))) for i in range(0, rows, size)]
        spans: list[list[int]] = []
        for group in rows_by_group(group_id).values():
            if spans and len(spans[-1]) + len(group) <= size:
                spans[-1] += group
            else:
                spans.append(list(group))
        return spans

    def _read(self, answer: Answer, rows: int) -> list[float | None]:
        """The answer's values, checked: as many as rows, each a finite number or null."""
        got = answer.value.get("rewards") if isinstance(answer.value, dict) else None
        if not isinstance(got, list):
            raise RemoteRewardError(f"reward {self.name!r}: {answer.source} answered {str(answer.value)[:120]!r}, "
                                    "not {\"rewards\": [...]}")
        if len(got) != rows:
            raise RemoteRewardError(f"reward {self.name!r}: {answer.source} answered {len(got)} values for a "
                                    f"request of {rows} rows")
        for i, v in enumerate(got):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise RemoteRewardError(f"reward {self.name!r}: {answer.source} answered {v!r} for row {i} of a "
                                        "request; expected a finite number or null")
        return [None if v is None else float(v) for v in got]


def stop_unless_skipped(name: str, on_failure: str, failure: Failure, span: Sequence[int], total: int,
                        group_ids: Sequence[int] | None) -> None:
    """Raise for a failed request of the rows `span` (of `total`) unless `on_failure` skips it (a
    replay miss is never skipped): one line naming the reward, the url, the status and the rows."""
    if on_failure == "skip" and not failure.fatal:
        return
    groups = sorted({group_ids[i] for i in span}) if group_ids is not None else []
    where = f"rows {min(span)}-{max(span)} of {total}" + (
        f" (prompt groups {groups[0]}-{groups[-1]})" if groups else "")
    if failure.fatal:
        raise RemoteRewardError(f"reward {name!r}: {failure.url} has no recorded answer for {where}; "
                                f"record it again with rewards.{name}.record")
    raise RemoteRewardError(f"reward {name!r}: {failure.describe()} for {where}, so the step did not "
                            f"train (rewards.{name}.client.on_failure=stop; skip trains those rows "
                            "without this reward)")


def is_served(spec: Any) -> bool:
    """Whether ``rewards.NAME`` (a `RewardSpec`) is scored remotely: it has a url or a replay file."""
    return bool(spec.url) or spec.replay is not None


def remote_problems(name: str, spec: Any) -> list[str]:
    """What is wrong with ``rewards.NAME``'s remote settings, each naming its key."""
    key, client = f"rewards.{name}", spec.client
    problems = [f"{key}.client.{field}={getattr(client, field)!r} must be >= 1"
                for field in ("batch_size", "concurrency") if getattr(client, field) < 1]
    problems += [f"{key}.client.{field}={getattr(client, field)!r} must be >= 0"
                 for field in ("retries", "backoff_s") if getattr(client, field) < 0]
    if client.timeout_s <= 0:
        problems.append(f"{key}.client.timeout_s={client.timeout_s!r} must be > 0")
    if spec.url is not None and not spec.url:
        problems.append(f"{key}.url is empty: give a url or a list of urls")
    if spec.record and spec.replay:
        problems.append(f"{key}: record and replay are both set; record writes a file that replay reads later")
    if spec.url and spec.replay:
        problems.append(f"{key}.url and {key}.replay are both set: replay answers every request from its file, "
                        f"without a server; leave {key}.url out to replay, or {key}.replay out to ask the server")
    if spec.record and not spec.url:
        problems.append(f"{key}.record needs {key}.url (the server whose answers are recorded)")
    if sends_own_requests(get_reward(name)):
        if not is_served(spec):
            problems.append(f"{key}.url: the judge needs the url of an OpenAI-compatible server (or {key}.replay)")
        problems += get_reward(name).args_problems(spec.args)
    if spec.server is not None and not spec.url:
        problems.append(f"{key}.server needs {key}.url (where the launched server listens)")
    if spec.server is not None and not spec.server.command.strip():
        problems.append(f"{key}.server.command is empty: the command that starts the server")
    return problems


def served_reward(name: str, spec: Any, slots: list[ServerSlot] | None = None, wait_s: float = 600.0) -> Callable[..., Any]:
    """The reward of ``rewards.NAME`` (a `RewardSpec` with url or replay, or scored by the run's placed servers
    `slots`, each waited for up to `wait_s` when it does not answer) as a remote reward, its column
    bindings applied as in process."""
    urls = [spec.url] if isinstance(spec.url, str) else list(spec.url or [])
    transport = Transport(urls, spec.client, record=spec.record, replay=spec.replay, slots=slots, wait_s=wait_s)
    local = get_reward(name)
    if sends_own_requests(local):  # a judge: it speaks its server's protocol through the transport
        remote = functools.partial(local, transport=transport, **spec.args)
    else:
        remote = RemoteReward(name, local, transport, spec.args)
    return ColumnBoundReward(name, remote, dict(spec.columns)) if spec.columns else remote


def sends_own_requests(fn: Callable[..., Any]) -> bool:
    """Whether the reward `fn` sends its own requests through a transport it is given (a judge)."""
    return bool(getattr(fn, SENDS_OWN_REQUESTS, False))
