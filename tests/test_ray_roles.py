"""The Ray launcher's logic without a cluster (the runs on one are in test_ray.py, slow): the roles a recipe
places and their commands, torchrun's variables of each rank, what each role's process is given, a server
process whose death ends its actor (so Ray starts it again), and the recipe checked before anything is placed."""

import subprocess
import sys
import textwrap

import pytest
from helpers import TINY_RECIPE

from mmrl.cli import ray_train
from mmrl.cli.main import main
from mmrl.config.parse import ConfigError, parse_config
from mmrl.distributed.ray_launch import LogTail, Outcome, forwarded_env, rank_envs
from mmrl.errors import UserError

pytest.importorskip("ray")

PLACED = ["policy.rollout_engine=hf_server", "placement.trainer=2", "placement.rollout=2", "placement.reward=1",
          "placement.rewards=[accuracy]"]


def test_the_roles_a_recipe_places_run_the_same_commands_as_without_ray(tmp_path):
    overrides = [f"output_dir={tmp_path}", *PLACED, "placement.gpus={rollout: 0.5}", "placement.cpus={trainer: 4}",
                 "placement.max_restarts=5"]
    trainer, rollout, reward = ray_train.ray_roles(parse_config(TINY_RECIPE, overrides), "r.yaml", overrides)
    assert (trainer.name, trainer.ranks, trainer.cpus, trainer.gpus, trainer.restarts) == ("trainer", True, 4.0, None, 0)
    assert trainer.commands == [[sys.executable, "-m", "mmrl", "train", "r.yaml", *overrides]] * 2
    assert (rollout.name, rollout.ranks, rollout.gpus, rollout.restarts, len(rollout.commands)) == ("rollout", False, 0.5, 5, 2)
    assert rollout.commands[1][3:5] == ["serve-rollout", "r.yaml"]
    assert rollout.commands[1][-1] == str(tmp_path / "servers" / "rollout-1.json")
    assert (reward.name, reward.cpus, reward.gpus, len(reward.commands)) == ("reward-accuracy", 1.0, None, 1)
    assert reward.commands[0][3:5] == ["serve-reward", "accuracy"]


def test_each_rank_gets_torchrun_variables_with_rank_0_as_the_rendezvous():
    places = [("10.0.0.1", 29500, "a"), ("10.0.0.1", 4000, "a"), ("10.0.0.2", 4001, "b")]
    cpu = rank_envs(places, gpus=0)
    assert [e["RANK"] for e in cpu] == ["0", "1", "2"]
    assert {(e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"], e["ACCELERATE_USE_CPU"]) for e in cpu} == {
        ("3", "10.0.0.1", "29500", "1")}
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in cpu] == [("0", "2"), ("1", "2"), ("0", "1")]
    gpu = rank_envs(places, gpus=1)  # each sees its own GPU only
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in gpu] == [("0", "1")] * 3
    assert all("ACCELERATE_USE_CPU" not in e for e in gpu)


def test_roles_get_the_run_environment_but_not_the_machine_specific_one():
    env = forwarded_env({"HF_HUB_OFFLINE": "1", "MMRL_X": "y", "PYTHONPATH": "/p", "CUDA_VISIBLE_DEVICES": "0",
                         "HOME": "/root", "OMP_NUM_THREADS": "2"})
    assert env == {"HF_HUB_OFFLINE": "1", "MMRL_X": "y", "PYTHONPATH": "/p", "OMP_NUM_THREADS": "2"}


def test_the_log_tail_shows_whole_new_lines_once(tmp_path):
    log, shown = tmp_path / "trainer-0.log", []
    tail = LogTail(log, shown.append)
    tail.show()  # no file yet
    log.write_text("step 1\nstep 2\npart")
    tail.show()
    with open(log, "a") as f:
        f.write("ial\n")
    tail.show()
    tail.show()
    assert shown == ["step 1", "step 2", "partial"]


def test_a_server_process_that_dies_ends_its_actor_and_a_rank_returns_its_code(tmp_path):
    """Outside Ray: the actor's class with a server that exits at once takes the process down (exit 1, which
    Ray answers by starting the actor again); a rank's `run` gives its command's exit code."""
    script = textwrap.dedent(f"""
        import sys, time
        from mmrl.distributed.ray_launch import RoleProcess
        rank = RoleProcess([sys.executable, "-c", "import os; print(os.environ['RANK'], os.environ['MMRL_PLACED'])"],
                           "{tmp_path}/trainer-0.log", {{}}, "{tmp_path}", server=False)
        assert rank.run({{"RANK": "3"}}) == 0
        RoleProcess([sys.executable, "-c", "raise SystemExit(7)"], "{tmp_path}/rollout-0.log", {{}}, "{tmp_path}",
                    server=True)
        time.sleep(60)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "3 1" in (tmp_path / "trainer-0.log").read_text()
    assert "the server exited with code 7; its actor ends (Ray starts it again)" in (tmp_path / "rollout-0.log").read_text()


def test_the_recipe_is_checked_before_anything_is_placed(tmp_path, monkeypatch, no_model):
    monkeypatch.setattr(ray_train, "launch", lambda *a, **k: pytest.fail("placed before the recipe was checked"))
    cfg = parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", *PLACED, "placement.rollout=0"])
    with pytest.raises(ConfigError, match="needs rollout servers"):
        ray_train.train_on_ray(cfg, "r.yaml", [], None)


def test_a_failed_rank_is_one_line_naming_its_log_and_how_to_resume(tmp_path, monkeypatch, no_model):
    (tmp_path / "servers").mkdir()
    (tmp_path / "servers" / "rollout-0.json").write_text("{}")  # an earlier run's address
    seen = []

    def failed(roles, log_dir, address):
        seen.append((tmp_path / "servers" / "rollout-0.json").exists())
        return Outcome(codes=[0, -9], failed=("trainer", 1, log_dir / "trainer-1.log"))
    monkeypatch.setattr(ray_train, "launch", failed)
    monkeypatch.setattr(ray_train.ckpt, "latest_checkpoint", lambda out: out / "checkpoints" / "step-000002")
    cfg = parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", *PLACED])
    with pytest.raises(UserError, match=r"trainer rank 1 was killed by signal 9, so the run stopped \(see .*logs/trainer-1.log\); "
                                        r"its newest checkpoint is .*step-000002: continue with the same command and resume=true"):
        ray_train.train_on_ray(cfg, "r.yaml", [], None)
    assert seen == [False]  # the stale address was cleared before anything was placed


def test_an_address_without_ray_is_refused(capsys):
    assert main(["train", "text_demo", "--address", "10.0.0.1:6379"]) == 2
    assert "--address is the Ray cluster's; give --ray" in capsys.readouterr().err
