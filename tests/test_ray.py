"""Ray as the launcher (docs/distributed.md#several-machines-with-ray), on a local cluster of three simulated
nodes on the CPU (`ray.cluster_utils.Cluster`): 2 trainer ranks, 2 rollout servers and 1 reward server
train a text and a diffusion recipe to the single-process run's weights (staleness 0); a rollout server
killed mid-run is started again by Ray and the run ends as if it had not died; a trainer rank killed mid-run
stops the run, and resume=true ends with the weights of an uninterrupted run. Each role's log is in
OUTPUT_DIR/logs. The fast checks of the roles the launcher places are in test_ray_roles.py."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY_RECIPE
from safetensors.torch import load_file
from test_async import DIFFUSION_RECIPE

from mmrl.cli.ray_train import train_on_ray
from mmrl.config.parse import load_recipe, parse_config
from mmrl.errors import UserError
from mmrl.train.loop.trainer import Trainer

ray_cluster_utils = pytest.importorskip("ray.cluster_utils")

PLACED = ["policy.rollout_engine=hf_server", "placement.trainer=2", "placement.rollout=2", "placement.reward=1"]


@pytest.fixture(scope="module")
def cluster():
    """A head and two worker nodes of 2 CPUs each (the CPUs Ray counts, not cores: the machine has 2)."""
    nodes = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    for _ in range(2):
        nodes.add_node(num_cpus=2)
    yield nodes
    nodes.shutdown()


def ray_run(cluster, tmp_path, recipe, name, *overrides):
    """`mmrl train RECIPE --ray --address CLUSTER OVERRIDES` (as the command runs it), in OUTPUT_DIR tmp_path/name."""
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    given = [f"output_dir={tmp_path / name}", *overrides]
    return train_on_ray(load_recipe(path, given), str(path), given, cluster.address)


def single_process(tmp_path, recipe, steps):
    t = Trainer(parse_config(recipe, [f"output_dir={tmp_path / 'single'}", f"max_steps={steps}"]))
    t.train()
    return t


def final_weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    model = out / "checkpoints" / f"step-{step:06d}" / "model"
    found = sorted(model.rglob("*.safetensors"))
    weights = {}
    for f in found:
        weights.update({f"{f.relative_to(model)}:{k}": v for k, v in load_file(f).items()})
    return weights


def assert_same_weights(a: dict, b: dict, atol=2e-5):
    assert a and a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=atol), name


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # 50-70 s each (measured at load 9): the Ray run (five processes start), one process
@pytest.mark.parametrize("recipe, steps, reward", [(TINY_RECIPE, 2, "accuracy"), (DIFFUSION_RECIPE, 2, "mean_red")],
                         ids=["text", "diffusion"])
def test_trainer_ranks_and_servers_on_three_nodes_train_the_single_process_weights(cluster, tmp_path, recipe, steps,
                                                                                     reward):
    single_process(tmp_path, recipe, steps)
    assert ray_run(cluster, tmp_path, recipe, "ray", f"max_steps={steps}", *PLACED, f"placement.rewards=[{reward}]") == 0
    out = tmp_path / "ray"
    assert_same_weights(final_weights(tmp_path / "single", steps), final_weights(out, steps))
    assert any(m["loss"] != 0 for m in metrics(out))  # the weights moved: equal weights say something
    assert [m["reward_mean"] for m in metrics(out)] == pytest.approx([m["reward_mean"] for m in metrics(tmp_path / "single")],
                                                                      abs=1e-6)
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert logs == [f"reward-{reward}-0.log", "rollout-0.log", "rollout-1.log", "trainer-0.log", "trainer-1.log"]
    assert "(world size 2)" in (out / "logs" / "trainer-0.log").read_text()


def kill_when(condition, pid_of, sig=signal.SIGKILL, timeout=600.0):
    """In a thread: once `condition()` holds, kill the process `pid_of()` names; the thread's `killed` list
    gets its pid."""
    killed: list[int] = []

    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                pid = pid_of()
                if pid is not None:
                    os.kill(pid, sig)
                    killed.append(pid)
                    return
            time.sleep(0.2)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, killed


def steps_logged(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def rank_pid(out: Path, rank: int) -> int | None:
    """The pid of trainer rank `rank` of the run in `out` (its command names out; its environment its RANK)."""
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"train" in command and f"output_dir={out}".encode() in command and f"RANK={rank}".encode() in env:
            return int(entry.name)
    return None


@pytest.mark.slow  # 50-70 s each (measured at load 9): a Ray run of 4 steps, which waits for the restart, one process
@pytest.mark.parametrize("server, banner", [("rollout-0", "serve-rollout: causal_lm tiny:qwen2-char on http://"),
                                            ("reward-accuracy-0", "serve-reward: accuracy on http://")],
                         ids=["rollout", "reward"])
def test_a_killed_server_is_restarted_and_the_run_ends_as_if_it_had_not_died(cluster, tmp_path, server, banner):
    """The only rollout server (or reward server) is killed after the first step: the run waits for Ray to
    start it again, asks it again for what it had in flight (the rollouts' same seeds), pushes a rollout
    server the newest weights, and ends with the weights of a run in which nothing died."""
    steps = 4
    single_process(tmp_path, TINY_RECIPE, steps)
    out = tmp_path / "ray"
    address = out / "servers" / f"{server}.json"
    thread, killed = kill_when(lambda: steps_logged(out) >= 1 and address.exists(),
                               lambda: json.loads(address.read_text())["pid"])
    assert ray_run(cluster, tmp_path, TINY_RECIPE, "ray", f"max_steps={steps}", *PLACED, "placement.rollout=1",
                   "placement.rewards=[accuracy]") == 0
    thread.join()
    assert killed, "the server was not killed mid-run"
    assert steps_logged(out) == steps
    assert json.loads(address.read_text())["pid"] != killed[0]  # a new server announced itself
    log = (out / "logs" / f"{server}.log").read_text()
    assert "the server exited with code -9; its actor ends (Ray starts it again)" in log
    assert log.count(banner) == 2
    assert_same_weights(final_weights(tmp_path / "single", steps), final_weights(out, steps))


@pytest.mark.slow  # 90 s (measured at load 9): two Ray runs (the killed one and its resume) and one process
def test_a_killed_trainer_rank_stops_the_run_and_resume_ends_with_the_uninterrupted_weights(cluster, tmp_path):
    steps = 4
    single_process(tmp_path, TINY_RECIPE, steps)
    out = tmp_path / "ray"
    saved = out / "checkpoints" / "step-000002"
    thread, killed = kill_when(saved.exists, lambda: rank_pid(out, 1))
    with pytest.raises(UserError, match=r"trainer rank 1 was killed by signal 9, so the run stopped .*newest "
                                        r"checkpoint is .*step-00000\d: continue with the same command and resume=true"):
        ray_run(cluster, tmp_path, TINY_RECIPE, "ray", f"max_steps={steps}", "save_every=1", *PLACED,
                "placement.rewards=[accuracy]")
    thread.join()
    assert killed
    assert ray_run(cluster, tmp_path, TINY_RECIPE, "ray", f"max_steps={steps}", "save_every=1", *PLACED,
                   "placement.rewards=[accuracy]", "resume=true") == 0
    assert_same_weights(final_weights(tmp_path / "single", steps), final_weights(out, steps))
