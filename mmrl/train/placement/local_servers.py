"""The run's placed servers (`placement.rollout`, `placement.reward`) started by its main process, when no
launcher placed them (`launch: local`): each a process of its own in its own process group, its output in
OUTPUT_DIR/logs/ROLE-INDEX.log, given the run's recipe (written to OUTPUT_DIR/servers/recipe.yaml). The
run waits until each answers, and stops them with the run, also when it ends on an error, Ctrl-C or
SIGTERM (SIGTERM to the group, SIGKILL after 10 s; on Linux they also get SIGTERM when the run's process
is killed outright). A server that dies is not started again (under Ray it is): the rollout servers left
take its requests, and with none left the run stops, naming its log."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
from pathlib import Path

import yaml

from mmrl.config.parse import to_dict
from mmrl.config.sections import TrainConfig
from mmrl.distributed.launcher import placed_by_launcher
from mmrl.serving.launch import STOP_GRACE_S, LaunchedServers, end_with_the_run
from mmrl.serving.server_directory import SERVERS, ServerSlot, address_file, log_file
from mmrl.train.placement.placed_servers import server_commands

RECIPE_FILE = "recipe.yaml"


class LocalServers:
    """The placed servers of `cfg`, started (on the main process, unless a launcher placed them) and waited for."""

    def __init__(self, cfg: TrainConfig, is_main: bool):
        self.processes: dict[str, subprocess.Popen] = {}
        if not is_main or placed_by_launcher():
            return
        recipe = Path(cfg.output_dir) / SERVERS / RECIPE_FILE
        commands = server_commands(cfg, str(recipe), [])
        if not commands:
            return
        atexit.register(self.stop)
        recipe.parent.mkdir(parents=True, exist_ok=True)
        recipe.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        try:
            for name, command in commands.items():
                address_file(cfg.output_dir, name).unlink(missing_ok=True)  # an earlier run's address
                self.processes[name] = _start(command, log_file(cfg.output_dir, name))
            for name in commands:
                ServerSlot.placed(cfg.output_dir, name).wait(cfg.placement.server_timeout_s,
                                                             alive=lambda n=name: self._exited(n))
        except BaseException:
            self.stop()
            raise

    def _exited(self, name: str) -> str | None:
        code = self.processes[name].poll()
        return None if code is None else f"exited with code {code} before it answered"

    def stop(self) -> None:
        for process in self.processes.values():
            _stop(process)


def _start(command: list[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ), preexec_fn=end_with_the_run)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL if it is still there after the grace time."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass



class RunServers:
    """Every server the run starts itself: those of `rewards.NAME.server` (serving/launch.py) and the
    placed ones (`LocalServers`); stopped together."""

    def __init__(self, cfg: TrainConfig, is_main: bool):
        self.launched = LaunchedServers(cfg.rewards, Path(cfg.output_dir), is_main)
        try:
            self.placed = LocalServers(cfg, is_main)
        except BaseException:
            self.launched.stop()
            raise

    def stop(self) -> None:
        self.placed.stop()
        self.launched.stop()
