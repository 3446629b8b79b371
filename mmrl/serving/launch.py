"""Reward servers a run starts itself (``rewards.NAME.server``): each command is started by the
run's main process before the model loads, in its own process group, with its output in
OUTPUT_DIR/servers/NAME.log; the run waits until the reward's first url answers the ``ready``
path with 200 (else it stops, showing the end of the log), and stops every server with the run,
also when it ends on an error, Ctrl-C or SIGTERM (SIGTERM to the group, SIGKILL after 10 s); on
Linux the server also gets SIGTERM when the run's process is killed outright."""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mmrl.config.remote import ServerLaunch
from mmrl.errors import UserError

STOP_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1  # prctl(2)


class LaunchedServer:
    """One server process: started, waited for, stopped."""

    def __init__(self, name: str, launch: ServerLaunch, url: str, log: Path):
        self.name, self.launch, self.log = name, launch, log
        self.ready_url = url.rstrip("/") + "/" + launch.ready.lstrip("/")
        env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": launch.devices} if launch.devices is not None else {}))
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            self.process = subprocess.Popen(launch.command, shell=True, executable=shutil.which("bash"), stdout=out,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                            preexec_fn=end_with_the_run)

    def wait_ready(self) -> None:
        """Return once the ready url answers 200; a UserError with the log's end when the process
        exits first or `timeout_s` passes."""
        deadline = time.monotonic() + self.launch.timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self._failed(f"exited with code {self.process.returncode} before it was ready")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=2.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise self._failed(f"was not ready at {self.ready_url} within {self.launch.timeout_s:g}s "
                           f"(rewards.{self.name}.server.timeout_s)")

    def _failed(self, what: str) -> UserError:
        self.stop()
        tail = self.log.read_text(errors="replace").strip().splitlines()[-10:] if self.log.exists() else []
        shown = " | ".join(tail) or "(empty)"
        return UserError(f"rewards.{self.name}.server: {self.launch.command!r} {what}; the end of its log "
                         f"{self.log}: {shown}")

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL if it is still there after the grace time."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass


def end_with_the_run() -> None:
    """In the server's process before its command runs (Linux): the kernel sends it SIGTERM when the
    run's process ends, also when the run is killed (SIGKILL, a second Ctrl-C) and cannot stop it.
    bash runs a command that is one simple command in its own process (exec), which keeps this."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the run's own stop remains
        pass


class LaunchedServers:
    """The servers of a recipe's rewards (name -> `RewardSpec`), started on the main process."""

    def __init__(self, rewards: dict[str, Any], output_dir: Path, is_main: bool):
        self.servers: list[LaunchedServer] = []
        if not is_main:
            return
        atexit.register(self.stop)  # an interpreter that ends without the run's own stop
        try:
            for name, spec in rewards.items():
                if spec.server is not None:
                    url = spec.url if isinstance(spec.url, str) else spec.url[0]
                    self.servers.append(LaunchedServer(name, spec.server, url,
                                                       Path(output_dir) / "servers" / f"{name}.log"))
            for server in self.servers:
                server.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
