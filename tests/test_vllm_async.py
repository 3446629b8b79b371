"""The vLLM rollout engine in the rollout worker (`rollout.mode: one_step_off | async`; causal_lm and vlm,
docs/async.md): the worker builds the policy's colocated engine, the trainer builds none, and the
weights the worker receives reach its engine before its next rollout. Needs vLLM: run in the venv of
scripts/make_vllm_env.sh as ``DIR/bin/python -m pytest -q -m vllm tests/test_vllm_async.py``.

Tolerances as tests/test_vllm.py (TOL: vLLM's log-probs against the training forward) and
tests/test_async.py (`assert_same_run`: a worker run against the synchronous run)."""

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from helpers import TINY_RECIPE
from test_async import VLM_RECIPE, assert_same_run, run
from test_vllm import PROMPTS, TINY, TOL, max_gap, perturb

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from mmrl.config.parse import ConfigError, parse_config  # noqa: E402
from mmrl.train.loop.trainer import Trainer  # noqa: E402
from mmrl.train.placement.rollout_worker import RolloutWorker  # noqa: E402
from mmrl.train.plan.validate import validate  # noqa: E402

VLLM_RECIPE = {**TINY_RECIPE, "policy": {**TINY_RECIPE["policy"], "tiny_args": TINY, "rollout_engine": "vllm"}}
KEYS = ("reward_mean", "reward/accuracy", "reward/digit_share", "completion_length", "loss")


@pytest.fixture(scope="module")
def synchronous(tmp_path_factory):
    """The synchronous vLLM run (its engine in the trainer's process), on one torch thread as the worker."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield run(tmp_path_factory.mktemp("sync"), "sync", recipe=VLLM_RECIPE, steps=2)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_vllm_in_the_worker_at_staleness_0_is_the_synchronous_run(tmp_path, synchronous, mode):
    """The worker's engine samples each group from its seed with the newest weights: the same
    completions, rewards, losses and weights as the synchronous run; its log-probs stay within TOL
    of the trainer's forward at every step (a missed weight sync would show there), and the
    trainer's process never builds an engine."""
    sync, sync_lines = synchronous
    worker, worker_lines = run(tmp_path, "worker", f"rollout.mode={mode}", "rollout.max_staleness=0",
                               recipe=VLLM_RECIPE, steps=2)
    assert sync.policy._vllm is not None and worker.policy._vllm is None
    assert any(x["loss"] != 0 for x in sync_lines)
    assert_same_run(sync, sync_lines, worker, worker_lines, KEYS)
    assert all(x["rollout/logp_diff_max"] <= TOL for x in worker_lines), [x["rollout/logp_diff_max"]
                                                                          for x in worker_lines]


@pytest.mark.usefixtures("one_torch_thread")  # the trainer on one torch thread, as the worker
def test_vllm_episodes_in_the_worker_are_the_synchronous_run(tmp_path):
    """Multi-turn episodes, each turn one call of the worker's engine: the same rewards, losses and
    episode counts as the synchronous run."""
    tools = ["policy.model=tiny:qwen2-chat-char", f"policy.episode.tools=[{Path(__file__).parent}/episode_tools.py:add]",
             "policy.episode.max_turns=2", "policy.episode.max_tokens=16"]
    sync, sync_lines = run(tmp_path, "sync", *tools, recipe=VLLM_RECIPE, steps=2)
    worker, worker_lines = run(tmp_path, "worker", *tools, "rollout.mode=async", "rollout.max_staleness=0",
                               recipe=VLLM_RECIPE, steps=2)
    assert sync.policy._vllm is not None and worker.policy._vllm is None
    assert sync_lines[0]["policy/episodes"] == 16
    assert_same_run(sync, sync_lines, worker, worker_lines,
                    ("reward_mean", "loss", "policy/episodes", "policy/episode_turns", "policy/truncated_episodes"))


VLLM_VLM_RECIPE = {**VLM_RECIPE, "policy": {**VLM_RECIPE["policy"], "tiny_args": TINY, "rollout_engine": "vllm"}}


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="the worker process has none of tests/vllm_without_torchvision.py's shims")
@pytest.mark.usefixtures("one_torch_thread")  # the vision tower's forward, as in test_async
def test_vllm_vlm_in_the_worker_at_staleness_0_is_the_synchronous_run(tmp_path):
    """The worker's engine is given its policy's processor and each row's image (a PIL image, as the
    trainer sent it): the same completions, rewards, losses and weights as the synchronous run."""
    sync, sync_lines = run(tmp_path, "sync", recipe=VLLM_VLM_RECIPE, steps=2)
    worker, worker_lines = run(tmp_path, "worker", "rollout.mode=async", "rollout.max_staleness=0",
                               recipe=VLLM_VLM_RECIPE, steps=2)
    assert sync.policy._vllm is not None and worker.policy._vllm is None
    assert any(x["loss"] != 0 for x in sync_lines)
    assert_same_run(sync, sync_lines, worker, worker_lines, ("reward_mean", "reward/digit_share", "completion_length",
                                                             "loss"))
    assert all(x["rollout/logp_diff_max"] <= TOL for x in worker_lines), [x["rollout/logp_diff_max"]
                                                                          for x in worker_lines]


def test_the_worker_engine_samples_with_the_weights_it_was_sent(tmp_path):
    """After a transfer of moved weights, the worker's vLLM log-probs of its completions match the
    trainer's training forward with those weights within TOL, and not the forward with the weights
    the engine was built with (the engine samples once before the transfer)."""
    t = Trainer(parse_config(VLLM_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=async"]))
    rows = [{"prompt": p} for p in PROMPTS]
    initial = copy.deepcopy(t.unwrapped)
    worker = RolloutWorker(t.cfg, t.unwrapped, 0)
    try:
        worker.take((1, 0, 0), rows[:1], 2, [0])  # the worker's engine is built with the initial weights
        perturb(t.unwrapped, 1)
        worker.send_weights(t.unwrapped, 1)
        drawn = worker.take((2, 0, 0), rows, 4, [1, 2, 3, 4])
    finally:
        worker.stop()
    assert drawn.weights_version.tolist() == [1] * len(drawn) and t.policy._vllm is None
    gap, tokens = max_gap(t.policy, drawn)
    assert tokens >= 16
    assert gap <= TOL, f"max |worker's vllm - trainer's forward| = {gap} over {tokens} tokens"
    with torch.no_grad():
        logp_initial, _ = t.policy.logprobs(initial, drawn)
    assert float((drawn.rollout_logp - logp_initial)[drawn.unit_mask.bool()].abs().max()) > 100 * TOL


def test_vllm_in_the_worker_refuses_evaluation_during_training(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout.mode=async with eval.every=2 and policy.rollout_engine=vllm "
                                          r"\(an evaluation samples in the trainer's process"):
        validate(parse_config(VLLM_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=async", "eval.every=2"]))
