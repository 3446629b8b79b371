"""Real reward servers for the tests: `mmrl serve-reward` or tests/reward_server_faults.py in a
subprocess on a free port, waited for on /health, stopped with SIGTERM."""

import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}): {process.stdout.read()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not healthy within {timeout}s")


def serve_command(name: str, port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "mmrl", "serve-reward", name, "--port", str(port), *args]


def fault_command(mode: str, port: int) -> list[str]:
    return [sys.executable, str(HERE / "reward_server_faults.py"), mode, str(port)]


@contextmanager
def running(command: list[str], port: int):
    """The server `command` (listening on `port`) while the block runs; yields (url, process)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:  # a server that hangs in a request
                process.kill()
                process.wait()
