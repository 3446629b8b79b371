"""Served rollouts with vLLM (`policy.rollout_engine: vllm_server`, docs/distributed.md#served-rollouts): a
rollout server runs the adapter's vLLM engine and is pushed the trainer's weights after every update;
the trainer builds no engine. Needs vLLM: run in the venv of scripts/make_vllm_env.sh as
``DIR/bin/python -m pytest -q -m vllm tests/test_vllm_served.py``.

Tolerances as tests/test_vllm.py (TOL: vLLM's log-probs against the training forward) and
tests/test_async.py (`assert_same_run`: another process generating, against the synchronous run)."""

import pytest
import torch
from rollout_servers import thread_servers
from test_async import assert_same_run, run
from test_vllm import TOL
from test_vllm_async import KEYS, VLLM_RECIPE

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from mmrl.config.parse import parse_config  # noqa: E402
from mmrl.serving.rollout_server import RolloutEngine, build_server_policy  # noqa: E402

SERVED_RECIPE = {**VLLM_RECIPE, "policy": {**VLLM_RECIPE["policy"], "rollout_engine": "vllm_server"}}


@pytest.fixture(scope="module")
def engines_kept():
    """Every vLLM engine the module builds, kept alive until its last test: vLLM's process-wide parallel
    state goes with the first engine destroyed, and the engines still alive then fail (tests/test_vllm_vlm.py)."""
    return []


@pytest.fixture(scope="module")
def synchronous(tmp_path_factory, engines_kept):
    """The run with vLLM colocated (its engine in the trainer's process), on one torch thread as the server."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sync, lines = run(tmp_path_factory.mktemp("sync"), "sync", recipe=VLLM_RECIPE, steps=2)
        engines_kept.append(sync)
        yield sync, lines
    finally:
        torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_torch_thread")  # the trainer on one torch thread, as the server's engine
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_vllm_served_run_at_staleness_0_is_the_synchronous_vllm_run(tmp_path, synchronous, engines_kept, mode):
    """The server's vLLM engine samples each group from its seed with the weights pushed after each update:
    the same completions, rewards, losses and weights as vLLM in the trainer's process; the served
    log-probs stay within TOL of the trainer's forward at every step (a pushed weight that did not reach
    vLLM would show there)."""
    sync, sync_lines = synchronous
    cfg = parse_config(SERVED_RECIPE, [f"output_dir={tmp_path}/server"])
    engine = RolloutEngine(build_server_policy(cfg, "cpu"), "127.0.0.1")
    engines_kept.append(engine)
    with thread_servers([engine]) as servers:
        served, served_lines = run(tmp_path, "served", f"rollout.servers=[{servers[0].url}]", f"rollout.mode={mode}",
                                   "rollout.max_staleness=0", recipe=SERVED_RECIPE, steps=2)
        assert engine.policy._vllm is not None and engine.version == 2
    assert sync.policy._vllm is not None and served.policy._vllm is None
    assert any(x["loss"] != 0 for x in sync_lines)
    assert_same_run(sync, sync_lines, served, served_lines, KEYS)
    assert all(x["rollout/logp_diff_max"] <= TOL for x in served_lines), [x["rollout/logp_diff_max"]
                                                                          for x in served_lines]
