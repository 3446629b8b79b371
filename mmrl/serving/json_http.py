"""Plain JSON over HTTP between the run's own processes (the trainer and the rollout servers it placed):
a POST of a JSON body, a GET that returns its status and body, and the readable detail of an error
body. Calls to reward servers and judges go through `transport` instead (retries, cache, recording)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


class ServerGone(Exception):
    """A server that did not answer (connection refused or reset, timed out)."""


def post(url: str, body: dict, timeout: float = 30.0) -> dict:
    """POST `body` as JSON; the decoded answer. OSError (urllib's errors included) when it fails."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def get(url: str, timeout: float) -> tuple[int, bytes]:
    """(status, body) of a GET; ServerGone when the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError):
        raise ServerGone(url) from None


def detail(body: bytes) -> str:
    """The `detail` of a JSON error body (FastAPI's), else its first 200 characters."""
    try:
        return str(json.loads(body).get("detail", body[:200]))
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")
