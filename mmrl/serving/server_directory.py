"""Where the run's placed servers are: each server, once it answers, writes its address into its own file,
OUTPUT_DIR/servers/ROLE-INDEX.json (``{"url", "pid", "incarnation"}``, replaced atomically), and writes it
again when it is started again (a new incarnation, maybe on another machine or port). A client reads the
file when it needs the server, and again when the server stops answering (`ServerSlot.wait`). The
output directory is the one place every role shares, on one machine or, on several, on a shared file
system; the role's log is OUTPUT_DIR/logs/ROLE-INDEX.log (docs/distributed.md)."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mmrl.distributed.launcher import NODE_ADDRESS_ENV
from mmrl.errors import UserError
from mmrl.serving.health import HEALTH_PATH

SERVERS, LOGS = "servers", "logs"
POLL_S = 0.5


def node_address() -> str:
    """This machine's address for the other roles: `MMRL_NODE_ADDR` (a launcher sets it on every node),
    else 127.0.0.1 (every role on this machine)."""
    return os.environ.get(NODE_ADDRESS_ENV, "127.0.0.1")


def advertised_host(host: str, given: str | None = None) -> str:
    """The address a server listening on `host` is reached at: `given`, else `node_address()` for a server
    listening on every interface, else `host`."""
    return given or (node_address() if host in ("0.0.0.0", "::") else host)


def slot_name(role: str, index: int) -> str:
    """A placed server's name: ROLE-INDEX, the role made safe for a file name (a reward's FILE.py:FUNCTION)."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', role)}-{index}"


def address_file(output_dir: str | Path, name: str) -> Path:
    return Path(output_dir) / SERVERS / f"{name}.json"


def log_file(output_dir: str | Path, name: str) -> Path:
    return Path(output_dir) / LOGS / f"{name}.log"


def announce(path: str | Path, url: str) -> str:
    """Write the server's address (a new incarnation) into `path`; returns the incarnation."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    incarnation = uuid.uuid4().hex
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "incarnation": incarnation}))
    os.replace(tmp, path)
    return incarnation


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether the server at `url` answers ``GET /health`` with 200 (stricter than `health_problem`, for which
    any answer below 500 is a server: a placed server's port may be taken by something else)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + HEALTH_PATH, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass(frozen=True)
class Address:
    url: str
    incarnation: str  # changes when the server is started again


class ServerSlot:
    """One server as a client finds it: a fixed url (a server started by hand: its incarnation is the url),
    or a placed server's address file."""

    def __init__(self, name: str, url: str | None = None, path: Path | None = None, log: Path | None = None):
        self.name, self.url, self.path, self.log = name, url, path, log

    @classmethod
    def placed(cls, output_dir: str | Path, name: str) -> ServerSlot:
        return cls(name, path=address_file(output_dir, name), log=log_file(output_dir, name))

    def address(self) -> Address | None:
        """The address the server last announced (a fixed url's), or None while there is none."""
        if self.url is not None:
            return Address(self.url.rstrip("/"), self.url)
        try:
            entry = json.loads(self.path.read_text())
            return Address(entry["url"].rstrip("/"), entry["incarnation"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def wait(self, timeout: float, replacing: Address | None = None,
             alive: Callable[[], str | None] | None = None) -> Address:
        """The server's address once it answers (and, given `replacing`, once that address is not the dead
        one, or that very server answers again); a UserError after `timeout` seconds, or as soon as `alive`
        says why the server cannot come back."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.address()
            if found is not None and answers(found.url):
                return found
            why = alive() if alive is not None else None
            if why is not None or time.monotonic() > deadline:
                raise UserError(f"{self.describe(replacing)} {why or f'did not answer within {timeout:g}s'}"
                                f"{self.see_log()}")
            time.sleep(POLL_S)

    def describe(self, replacing: Address | None = None) -> str:
        where = f" ({replacing.url})" if replacing is not None else f" ({self.url})" if self.url else ""
        return f"server {self.name}{where}"

    def see_log(self) -> str:
        return f"; see its log {self.log}" if self.log is not None else ""
