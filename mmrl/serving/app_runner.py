"""A server's app run until it is told to stop: uvicorn on a port (0: a free one the system picks), ended
cleanly by SIGINT or SIGTERM (the requests in flight finish), and, for a server the run placed, its
address announced once it answers (`server_directory.announce`)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from mmrl.errors import UserError
from mmrl.serving.server_directory import advertised_host, announce


def bound_socket(host: str, port: int, command: str = "serve") -> socket.socket:
    """A listening socket on `host`:`port` (0: a free port), or a UserError naming the port (taken by
    another server, or not this machine's) and `command`, before anything claims the server is up."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserError(f"mmrl {command}: cannot listen on {host}:{port} ({e.strerror or e}): another server "
                        f"holds port {port}, or {host!r} is not an address of this machine; choose --port or --host"
                        ) from None
    sock.listen(128)
    return sock


def run_app(app: Any, host: str, port: int, what: str, announce_to: str | None = None,
            advertise: str | None = None, routes: str = "") -> None:
    """Serve `app` until SIGINT or SIGTERM. Once it answers, print ``mmrl WHAT on URL ROUTES`` and, with
    `announce_to`, write its address there; the url names `advertise` (this machine's address for the
    other machines), else `server_directory.advertised_host`'s."""
    import uvicorn
    sock = bound_socket(host, port, what.split(":")[0])
    url = f"http://{advertised_host(host, advertise)}:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=_announce_when_started, args=(server, f"mmrl {what} on {url}{routes}", url, announce_to),
                     daemon=True).start()
    for stop in (signal.SIGINT, signal.SIGTERM):  # uvicorn shuts down, then hands the signal on to this
        signal.signal(stop, _stopped(what))
    server.run(sockets=[sock])


def _announce_when_started(server: Any, banner: str, url: str, announce_to: str | None) -> None:
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    if announce_to is not None:
        announce(Path(announce_to), url)
    print(banner, flush=True)


def _stopped(what: str):
    def stopped(signum: int, frame: Any) -> None:
        print(f"mmrl {what}: {signal.Signals(signum).name}: stopped", flush=True)
        raise SystemExit(0)
    return stopped
