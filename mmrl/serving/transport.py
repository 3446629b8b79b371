"""How a remote call is sent, whatever it carries: JSON bodies posted to one or several urls (in
turn), a bounded number at once, each with a timeout and a bounded number of retries with
exponential backoff on the named statuses, timeouts and connection errors; answers cached by the
content hash of the request, and recorded to or replayed from a file (`recording`); an API key
from the environment variable ``client.api_key_env`` is sent as a Bearer token. What is sent
and how an answer is read belong to the caller (the remote reward, a judge).

Servers the run placed (`server_directory.ServerSlot`) are found where they announce themselves; one
that does not answer (a connection error) is waited for until it is back, restarted by its launcher,
without spending a retry (up to `wait_s`, then a UserError naming it and its log)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mmrl.config.remote import ClientSettings
from mmrl.errors import UserError
from mmrl.serving.recording import Recording
from mmrl.serving.server_directory import ServerSlot
from mmrl.serving.wire import content_hash, dumps


CONNECTION_ERROR = "a connection error"


@dataclass
class Answer:
    """A request's decoded JSON answer and where it came from (a url, ``cache`` or the replay file)."""

    source: str
    value: Any


@dataclass
class Failure:
    """A request that got no usable answer: where it went, what came back (``HTTP 500``, ``timed out
    after 5s``, ``connection refused``), and whether retries were spent on it."""

    url: str
    status: str
    attempts: int = 1
    fatal: bool = False  # a failure no policy may skip (a request a replay file does not hold)

    def describe(self) -> str:
        tries = f" after {self.attempts} attempts" if self.attempts > 1 else ""
        return f"{self.url} answered {self.status}{tries}"


def api_key(variable: str) -> str:
    """The API key in the environment variable `variable` (``client.api_key_env``); unset is an error."""
    key = os.environ.get(variable, "")
    if not key:
        raise UserError(f"client.api_key_env={variable!r}: the environment variable {variable} is not set "
                        "(export the server's API key in it)")
    return key


class Transport:
    """Posts request bodies as `ClientSettings` say; see the module docstring."""

    def __init__(self, urls: list[str], settings: ClientSettings, record: str | None = None,
                 replay: str | None = None, slots: list[ServerSlot] | None = None, wait_s: float = 600.0):
        self.urls, self.settings = [u.rstrip("/") for u in urls], settings
        self.slots, self.wait_s = slots or [], wait_s
        self.recording = Recording(record, replay) if record or replay else None
        self._cache: dict[str, Any] = {}
        self._turn = itertools.count()
        self.headers = {"Content-Type": "application/json"}
        if settings.api_key_env:
            self.headers["Authorization"] = f"Bearer {api_key(settings.api_key_env)}"

    def send(self, path: str, bodies: list[Any]) -> list[Answer | Failure]:
        """Each body's answer (decoded JSON) or its `Failure`, in order."""
        if len(bodies) <= 1 or self.settings.concurrency <= 1:
            return [self._answer(path, body) for body in bodies]
        with ThreadPoolExecutor(min(self.settings.concurrency, len(bodies))) as pool:
            return list(pool.map(lambda body: self._answer(path, body), bodies))

    def _answer(self, path: str, body: Any) -> Answer | Failure:
        data = dumps(body)
        key = content_hash(data)
        if self.recording is not None and self.recording.replaying:
            found = self.recording.answer(key)
            return (Answer(f"replay file {self.recording.replay}", found) if found is not None
                    else Failure(self.recording.replay, "no recorded answer", fatal=True))
        if self.settings.cache and key in self._cache:
            return Answer("cache", self._cache[key])
        answer = self._post_with_retries(path, data)
        if not isinstance(answer, Failure):
            if self.settings.cache:
                self._cache[key] = answer.value
            if self.recording is not None:
                self.recording.write(key, answer.value)
        return answer

    def _post_with_retries(self, path: str, data: bytes) -> Answer | Failure:
        s = self.settings
        first = next(self._turn)
        attempt = 0
        while True:
            turn = first + attempt  # a retry goes to the next url
            url = (self._slot_url(turn) if self.slots else self.urls[turn % len(self.urls)]) + path
            answer, retry = self._post(url, data)
            if self.slots and isinstance(answer, Failure) and answer.status.startswith(CONNECTION_ERROR):
                self.slots[turn % len(self.slots)].wait(self.wait_s)  # a placed server restarting: not a retry
                continue
            if not retry or attempt == s.retries:
                if isinstance(answer, Failure):
                    answer.attempts = attempt + 1
                return answer
            time.sleep(s.backoff_s * 2 ** attempt)
            attempt += 1

    def _slot_url(self, turn: int) -> str:
        """The url a placed server announced (waited for while it has none that answers)."""
        slot = self.slots[turn % len(self.slots)]
        address = slot.address()
        return (address.url if address is not None else slot.wait(self.wait_s).url).rstrip("/")

    def _post(self, url: str, data: bytes) -> tuple[Answer | Failure, bool]:
        """(the answer or its failure, whether the failure may be retried)."""
        request = urllib.request.Request(url, data=data, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:200].decode(errors="replace").strip()
            status = f"HTTP {e.code}" + (f" ({detail})" if detail else "")
            return Failure(url, status), e.code in self.settings.retry_statuses
        except (TimeoutError, socket.timeout):
            return Failure(url, f"no answer (timed out after {self.settings.timeout_s:g}s)"), True
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, (TimeoutError, socket.timeout)):
                return Failure(url, f"no answer (timed out after {self.settings.timeout_s:g}s)"), True
            return Failure(url, f"{CONNECTION_ERROR} ({reason})"), True
        except (ConnectionError, OSError) as e:
            return Failure(url, f"{CONNECTION_ERROR} ({e})"), True
        try:
            return Answer(url, json.loads(text)), False
        except ValueError:
            return Failure(url, f"an answer that is not JSON ({text[:80]!r})"), False
