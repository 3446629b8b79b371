"""Whether a server answers at each served reward's urls (``rewards.NAME.url``), asked before the
model loads and after the run's own servers have started (`launch`): ``GET URL/health`` (what
`mmrl serve-reward`, vLLM and `transformers serve` answer). A url where nothing answers (connection
refused, no such host, no answer within the time) or that answers a server error is one line
naming the key, the url and what happened; any other HTTP answer means a server is there (an
OpenAI-compatible API without ``/health`` answers 404). A reward replayed from a file is not asked."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from typing import Any, Mapping

from mmrl.errors import UserError

HEALTH_PATH = "/health"
HEALTH_TIMEOUT_S = 10.0  # at most; a reward's client.timeout_s when shorter


def health_problem(url: str, timeout_s: float) -> str | None:
    """What keeps `url` from serving (None: a server answered GET url/health)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + HEALTH_PATH, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as e:
        return None if e.code < 500 else f"answered GET {HEALTH_PATH} with HTTP {e.code}"
    except (TimeoutError, socket.timeout):
        return f"did not answer GET {HEALTH_PATH} within {timeout_s:g}s"
    except urllib.error.URLError as e:
        if isinstance(e.reason, (TimeoutError, socket.timeout)):
            return f"did not answer GET {HEALTH_PATH} within {timeout_s:g}s"
        return f"nothing answers there ({e.reason})"
    except OSError as e:
        return f"nothing answers there ({e})"


def check_reward_servers(rewards: Mapping[str, Any]) -> None:
    """Raise a UserError, a line per url, where no server answers at a reward's url (name -> `RewardSpec`)."""
    problems = []
    for name, spec in rewards.items():
        if spec.replay is not None or not spec.url:
            continue
        urls = [spec.url] if isinstance(spec.url, str) else list(spec.url)
        for url in urls:
            problem = health_problem(url, min(spec.client.timeout_s, HEALTH_TIMEOUT_S))
            if problem is not None:
                problems.append(f"rewards.{name}.url: {url} {problem}; start its server (mmrl serve-reward "
                                f"{name} --port PORT, or give rewards.{name}.server to start it with the run) "
                                "or correct the url")
    if problems:
        raise UserError(problems[0] if len(problems) == 1 else
                        f"{len(problems)} reward servers do not answer:\n  " + "\n  ".join(problems))
