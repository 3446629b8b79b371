"""A live run locks its output directory: a second run there (new, resume or overwrite) is refused
before any model loads, naming the live process; a lock left by a killed run is taken over."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import TINY_RECIPE, tiny_overrides
from test_safe_runs import forbid_loading

from mmrl.config.parse import parse_config
from mmrl.errors import UserError
from mmrl.train.loop.trainer import Trainer
from mmrl.train.reporting.tracking import read_metrics
from mmrl.train.safety.run_lock import LOCK_FILE

HERE = Path(__file__).parent


def make(out, *extra):
    return Trainer(parse_config(TINY_RECIPE, tiny_overrides(out) + list(extra)))


def test_a_live_run_refuses_a_second_one_naming_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(dict(TINY_RECIPE, max_steps=1,
                                          rewards={**TINY_RECIPE["rewards"], "pause": {"weight": 0.0}},
                                          reward_modules=TINY_RECIPE["reward_modules"] + [str(HERE / "pause_reward.py")])))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MMRL_TEST_PAUSE_DIR": str(tmp_path)}
    first = subprocess.Popen([sys.executable, "-m", "mmrl", "train", str(recipe), f"output_dir={out}", "resume=auto"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "paused").exists():  # the first run is inside its first step
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.2)
        forbid_loading(monkeypatch)
        for extra in (["resume=auto"], ["overwrite=true"], ["resume=true"], []):
            with pytest.raises(UserError, match=rf"output_dir '{out}' is in use by a live run: pid {first.pid} "
                                                rf"on host {socket.gethostname()} since 20"):
                make(out, *extra)
    finally:
        (tmp_path / "go").touch()
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1]  # nothing mixed in
    assert (out / LOCK_FILE).read_text() == ""  # released at the end
    with pytest.raises(UserError, match="holds another run's files"):  # the directory is free again
        make(out)


def test_the_lock_of_a_killed_run_is_taken_over_with_a_note(tmp_path, capsys):
    out = tmp_path / "run"
    killed = subprocess.Popen([sys.executable, "-c", "import os, signal; from mmrl.train.safety.run_lock import RunLock; "
                               f"lock = RunLock({str(out)!r}); os.kill(os.getpid(), signal.SIGKILL)"])
    assert killed.wait(timeout=120) == -signal.SIGKILL
    assert f'"pid": {killed.pid}' in (out / LOCK_FILE).read_text()  # the record it could not empty
    trainer = make(out)
    said = capsys.readouterr().out
    assert (f"taking over the lock of a run that ended without releasing it (pid {killed.pid} on host "
            f"{socket.gethostname()} since 20") in said
    assert f'"pid": {os.getpid()}' in (out / LOCK_FILE).read_text()
    with pytest.raises(UserError, match=rf"in use by a live run: pid {os.getpid()} .*\(this Python process"):
        make(out)
    trainer.train()
    assert (out / LOCK_FILE).read_text() == ""
