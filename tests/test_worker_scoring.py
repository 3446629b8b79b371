"""Where a rollout worker's rollouts are scored (`scoring.where`, docs/async.md): in the worker, each
generation call scored in a thread while it generates the next, with the same rewards, losses and
weights as when the trainer scores; `auto` picks the worker when every reward is served."""

import os
from pathlib import Path

import pytest
from helpers import TINY_RECIPE
from served import HERE, free_port, running, serve_command

from mmrl.config.parse import ConfigError, parse_config
from mmrl.train.placement.rollout_modes import scores_in_worker
from mmrl.train.plan.validate import validate
from test_async import assert_same_run, run

PID_REWARD = str(HERE / "pid_reward.py")


def scored_by(path: Path) -> set[int]:
    return {int(line) for line in path.read_text().split()}


@pytest.mark.slow  # 20 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
def test_the_worker_scores_with_the_rewards_the_trainer_would_give(tmp_path):
    """A served reward (a real `mmrl serve-reward`) and an in-process one that records which process
    scores: with scoring.where=worker only the worker's process scores, and the rollouts, rewards,
    losses and weights are the run's where the trainer scores (one_step_off at staleness 0)."""
    port = free_port()
    with running(serve_command("digit_share", port, "--reward-module", str(HERE / "digit_reward.py")), port) as (url, _):
        runs = {}
        for where in ("trainer", "worker"):
            pids = tmp_path / f"{where}.pids"
            recipe = dict(TINY_RECIPE, reward_modules=[*TINY_RECIPE["reward_modules"], PID_REWARD],
                          rewards={"accuracy": {"weight": 1.0}, "digit_share": {"weight": 1.0, "url": url},
                                   "scoring_pid": {"weight": 0.0, "args": {"path": str(pids)}}})
            runs[where] = run(tmp_path, where, "rollout.mode=one_step_off", "rollout.max_staleness=0",
                              f"scoring.where={where}", recipe=recipe)
            runs[where + "_pids"] = scored_by(pids)
    assert runs["trainer_pids"] == {os.getpid()}
    assert len(runs["worker_pids"]) == 1 and os.getpid() not in runs["worker_pids"]
    assert_same_run(*runs["trainer"], *runs["worker"],
                    ("reward_mean", "reward/accuracy", "reward/digit_share", "completion_length", "loss"))


def test_auto_scores_in_the_worker_only_when_every_reward_is_served(tmp_path):
    def cfg(*overrides, rewards=None):
        recipe = dict(TINY_RECIPE, rewards=rewards or TINY_RECIPE["rewards"])
        return parse_config(recipe, [f"output_dir={tmp_path}", "rollout.mode=async", *overrides])
    served = {"digit_share": {"weight": 1.0, "url": "http://127.0.0.1:1"}}
    assert scores_in_worker(cfg(rewards=served))
    assert not scores_in_worker(cfg(rewards={**served, "accuracy": {"weight": 1.0}}))  # a reward in process
    assert scores_in_worker(cfg("scoring.where=worker"))
    assert not scores_in_worker(cfg("scoring.where=trainer", rewards=served))
    assert not scores_in_worker(cfg("rollout.mode=sync", rewards=served))


def test_worker_scoring_without_a_worker_or_with_a_record_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"scoring.where=worker with rollout.mode=sync \(there is no rollout worker"):
        validate(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", "scoring.where=worker"]))
    recorded = dict(TINY_RECIPE, rewards={"digit_share": {"weight": 1.0, "url": "http://127.0.0.1:1",
                                                          "record": str(tmp_path / "answers.jsonl")}})
    with pytest.raises(ConfigError, match=r"scoring.where=auto with rewards.digit_share.record \(the trainer's"):
        validate(parse_config(recorded, [f"output_dir={tmp_path}", "rollout.mode=async"]))


def test_a_reward_that_fails_in_the_worker_stops_the_run_with_its_message(tmp_path):
    from mmrl.train.placement.rollout_worker import RolloutWorkerDied
    recipe = dict(TINY_RECIPE, reward_modules=[*TINY_RECIPE["reward_modules"], PID_REWARD],
                  rewards={"accuracy": {"weight": 1.0},
                           "scoring_pid": {"weight": 0.0, "args": {"path": str(tmp_path / "missing" / "pids")}}})
    with pytest.raises(RolloutWorkerDied, match=r"(?s)the rollout worker failed:.*FileNotFoundError"):
        run(tmp_path, "failing", "rollout.mode=async", "scoring.where=worker", recipe=recipe)


def test_a_users_error_in_the_worker_reads_as_one_line_and_keeps_the_traceback_for_debug():
    """A served reward's RemoteRewardError in the worker stops the run in one line, as in the
    trainer; any other error brings the worker's whole traceback; either way it is the cause."""
    from mmrl.serving.remote_reward import RemoteRewardError
    from mmrl.train.placement.rollout_worker import worker_failure
    from mmrl.train.placement.worker_process import WorkerTraceback, failure_message
    try:
        raise RemoteRewardError("rewards.digit_share: http://127.0.0.1:1 answered 500")
    except RemoteRewardError as e:
        users = worker_failure(failure_message(e))
    try:
        {}["missing"]
    except KeyError as e:
        other = worker_failure(failure_message(e))
    assert str(users) == "the rollout worker stopped: rewards.digit_share: http://127.0.0.1:1 answered 500"
    assert str(other).startswith("the rollout worker failed:\nTraceback") and "KeyError: 'missing'" in str(other)
    for error in (users, other):
        assert isinstance(error.__cause__, WorkerTraceback) and "Traceback" in str(error.__cause__)
