"""Run an untrusted command in a subprocess under limits (the LaTeX reward's compiles, the
episodes' Python tool): its own process group in a scratch working directory with only the
environment given, CPU-time, address-space, file-size, open-file and core limits on the process,
a wall-time limit after which the whole group is killed, and nothing of the group left running
after the call."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
from dataclasses import dataclass


@dataclass
class Limits:
    """`timeout` seconds of wall time (CPU time: one more), `memory_mb` of address space,
    `file_mb` written per file, `open_files` descriptors at once."""

    timeout: float = 10.0
    memory_mb: int = 1024
    file_mb: int = 32
    open_files: int = 256


def _apply(limits: Limits):
    def apply() -> None:
        cpu = int(limits.timeout) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb << 20, limits.memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb << 20, limits.file_mb << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_limited(cmd: list[str], cwd: str, env: dict[str, str], limits: Limits,
                stdin: bytes | None = None) -> tuple[int | None, str]:
    """(exit code, stdout and stderr together) of `cmd`; the code is None when it ran past
    `limits.timeout` (its group is then killed)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_apply(limits))
    try:
        out, _ = proc.communicate(input=stdin, timeout=limits.timeout)
        return proc.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return None, "timeout"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the group outlives the call
        except ProcessLookupError:
            pass
        proc.wait()
