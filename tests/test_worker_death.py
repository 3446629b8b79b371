"""The rollout worker's death (docs/async.md#checkpoints-resume-and-a-dead-worker): however the
worker's process vanishes (killed while it builds its model, while it joins the weights group, with
its rollouts in the queue, mid-run), the trainer stops with `RolloutWorkerDied` in one line naming
how it ended, the error that showed it kept as the cause; `mmrl train` prints that line with the
checkpoint it saved, exits with code 2, and `resume=true` goes on."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import TINY_RECIPE

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.serving import weights_broadcast
from mmrl.train.placement.rollout_worker import RolloutWorker, RolloutWorkerDied


def trainer(tmp_path, *overrides):
    return Trainer(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=async", *overrides]))


def kill(process) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.join()


def test_a_worker_killed_while_it_builds_its_model(tmp_path, monkeypatch):
    """Killed before it joins the weights group: the trainer, waiting for it to join, raises at once."""
    join = RolloutWorker._join
    monkeypatch.setattr(RolloutWorker, "_join", lambda worker, device: (kill(worker.process), join(worker, device)))
    t = trainer(tmp_path)
    try:
        with pytest.raises(RolloutWorkerDied, match=r"^the rollout worker \(pid \d+\) was killed by SIGKILL while it "
                                                    r"built its model; rollout.mode=async cannot go on$"):
            RolloutWorker(t.cfg, t.unwrapped, 0)
    finally:
        t.release_output_dir()


@pytest.mark.slow  # 20 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
def test_a_worker_killed_while_it_joins_the_weights_group(tmp_path, monkeypatch):
    """Killed once it has built its model and said so, as the group forms: forming it fails (here after
    a join timeout shortened to 3 s, where it would wait 2 minutes), and the trainer raises that."""
    monkeypatch.setattr(weights_broadcast, "JOIN_TIMEOUT", weights_broadcast.datetime.timedelta(seconds=3))
    join = RolloutWorker._join

    def killed_once_ready(worker, device):
        while not worker.sender.store.check([weights_broadcast.WORKER_DEVICE_KEY]):
            time.sleep(0.05)
        kill(worker.process)
        join(worker, device)

    monkeypatch.setattr(RolloutWorker, "_join", killed_once_ready)
    t = trainer(tmp_path)
    try:
        with pytest.raises(RolloutWorkerDied, match=r"was killed by SIGKILL while joining the weights transfer "
                                                    r"\((DistStoreError|RuntimeError|DistNetworkError): ") as err:
            RolloutWorker(t.cfg, t.unwrapped, 0)
        assert isinstance(err.value.__cause__, RuntimeError)
    finally:
        t.release_output_dir()


def test_a_worker_killed_with_its_rollouts_in_the_queue(tmp_path):
    """The rollouts' tensors travel as handles the trainer redeems from the worker's process: read after
    the worker died, they fail (a reset or refused connection), and that is the worker's death, with the
    connection's error as the cause, not a traceback."""
    t = trainer(tmp_path)
    rows = [t.inputs.train_rows[0]]
    worker = RolloutWorker(t.cfg, t.unwrapped, 0)
    try:
        worker.ask((1, 0, 0), rows, 3, [0])
        deadline = time.monotonic() + 120
        while worker.results.empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not worker.results.empty()
        kill(worker.process)
        with pytest.raises(RolloutWorkerDied, match=r"was killed by SIGKILL while the trainer read its rollouts "
                                                    r"\((ConnectionResetError|ConnectionRefusedError|FileNotFoundError|"
                                                    r"EOFError)") as err:
            worker.take((1, 0, 0), rows, 3, [0])
        assert isinstance(err.value.__cause__, (OSError, EOFError))
    finally:
        worker.stop()
        t.release_output_dir()


def worker_pid(run: subprocess.Popen) -> int:
    """The rollout worker's pid: the run's spawned child (the other is multiprocessing's resource tracker)."""
    children = " ".join(p.read_text() for p in Path(f"/proc/{run.pid}/task").glob("*/children")).split()
    spawned = [int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(spawned) == 1, children
    return spawned[0]


def mmrl_train(recipe: Path, out: Path, *overrides: str) -> subprocess.Popen:
    # the checkpoint save's third-party chatter (accelerate's tied-weights warning, transformers' shard
    # progress bar) is quietened: what is tested is mmrl's own output
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ACCELERATE_LOG_LEVEL": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    return subprocess.Popen([sys.executable, "-m", "mmrl", "train", str(recipe), f"output_dir={out}", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow  # 64 s on 2 loaded cores: two `mmrl train` processes, each with its worker
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the worker's pid in /proc")
def test_mmrl_train_with_its_worker_killed_prints_one_line_naming_the_checkpoint(tmp_path):
    """kill -9 of the worker of a running `mmrl train`: exit code 2, stderr one line naming the saved
    checkpoint, and `resume=true` trains the remaining steps."""
    recipe, out = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text(yaml.safe_dump({**TINY_RECIPE, "max_steps": 500, "save_every": 0}))
    run = mmrl_train(recipe, out, "rollout.mode=one_step_off")
    try:
        deadline, metrics = time.monotonic() + 300, out / "metrics.jsonl"
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2) and run.poll() is None:
            assert time.monotonic() < deadline, "the run trained no 2 steps in 5 minutes"
            time.sleep(0.1)
        os.kill(worker_pid(run), signal.SIGKILL)
        stdout, stderr = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 2, stderr
    [line] = stderr.strip().splitlines()
    step = len(metrics.read_text().splitlines())
    saved = out / "checkpoints" / f"step-{step:06d}"
    assert line.startswith("mmrl: error: the rollout worker (pid ") and " was killed by SIGKILL " in line, line
    assert line.endswith(f"the run failed after step {step}, which is saved in {saved}; fix the cause, "
                         "then resume=true"), line
    assert (saved / "trainer_state.json").is_file()
    resumed = mmrl_train(recipe, out, "rollout.mode=one_step_off", "resume=true", f"max_steps={step + 2}")
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == list(range(1, step + 3))
