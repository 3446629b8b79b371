"""The urls of the served rewards (``rewards.NAME.url``, one or a list) checked before anything loads:
each an ``http://`` or ``https://`` url with a host. Whether a server answers there is asked once
the run's own servers have started, still before the model loads (`mmrl.serving.health`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

SCHEMES = ("http", "https")


def url_problems(name: str, spec: Any) -> list[str]:
    """What is wrong with the urls of ``rewards.NAME`` (a `RewardSpec`), each naming its key."""
    urls = [spec.url] if isinstance(spec.url, str) else list(spec.url or [])
    problems = []
    for i, url in enumerate(urls):
        key = f"rewards.{name}.url" + (f"[{i}]" if not isinstance(spec.url, str) else "")
        problem = url_problem(url)
        if problem:
            problems.append(f"{key}={url!r}: {problem}")
    return problems


def url_problem(url: str) -> str | None:
    """Why `url` cannot reach a reward server, or None."""
    if "://" not in url:
        return f"give the scheme, http:// or https:// (e.g. 'http://{url}')"
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        return f"the scheme {parts.scheme!r} is not http or https; a reward server answers HTTP requests"
    if not parts.hostname:
        return "the url names no host (http://HOST:PORT)"
    try:
        parts.port  # noqa: B018 (a port that is not a number raises)
    except ValueError as e:
        return f"{e} (http://HOST:PORT)"
    return None
