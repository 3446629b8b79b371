"""Rollout servers for the tests: `mmrl serve-rollout`'s engine and app (serving/rollout_server.py) run in a
thread of the test's process on a free port, announcing themselves where a placed server would; stopped
with the block (a server that stops answers no more: a server that died, as the client sees it)."""

import threading
import time
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from mmrl.serving.app_runner import bound_socket
from mmrl.serving.rollout_server import RolloutEngine, rollout_app
from mmrl.serving.server_directory import announce


class ThreadServer:
    """`engine` behind its app in a thread; `url` once it answers; `stop` ends it."""

    def __init__(self, engine: RolloutEngine, announce_to: Path | None = None):
        self.engine = engine
        sock = bound_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(rollout_app(engine, "test"), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        if announce_to is not None:
            announce(announce_to, self.url)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.engine.stop()


@contextmanager
def thread_servers(engines, announce_to=None):
    """ThreadServers of `engines` (each announcing at `announce_to[i]` if given) while the block runs."""
    servers = [ThreadServer(e, None if announce_to is None else announce_to[i]) for i, e in enumerate(engines)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()
