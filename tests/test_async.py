"""Asynchronous rollouts (docs/async.md): each row's weights version and the staleness statistics,
the decoupled (proximal) objective against hand-written references."""

import json
import math
from pathlib import Path

import pytest
import torch
from helpers import TINY_RECIPE

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.config.parse import ConfigError, parse_config
from mmrl.core.objectives import policy_loss
from mmrl.core.rollout import Rollout, staleness_metrics
from mmrl.core.rollout_correction import importance_weights
from mmrl.registry import import_user_module
from mmrl.train.rollout_worker import RolloutWorker, RolloutWorkerDied
from mmrl.train.plan import validate
from mmrl.train.trainer import Trainer


def trainer(tmp_path, *overrides):
    return Trainer(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", *overrides]))


def test_staleness_metrics_against_hand_counts():
    metrics = staleness_metrics(torch.tensor([3, 2, 2, 0]), 3)  # 0, 1, 1, 3 steps behind
    assert metrics == {"rollout/staleness_mean": 1.25, "rollout/staleness_max": 3.0}
    assert staleness_metrics(torch.zeros(0, dtype=torch.long), 3) == {}


def test_the_version_is_kept_through_select_and_concat():
    def rollout(version):
        r = Rollout(torch.tensor([0, 0]), ["p", "p"], ["a", "b"], torch.ones(2, 3))
        r.stamp_version(version)
        return r
    both = Rollout.concat([rollout(4), rollout(7)])
    assert both.weights_version.tolist() == [4, 4, 7, 7]
    assert both.select([3, 0]).weights_version.tolist() == [7, 4]


def test_every_row_carries_the_weights_it_was_drawn_by_and_the_step_logs_staleness(tmp_path):
    t = trainer(tmp_path)
    metrics = t.train_step()
    assert metrics["rollout/staleness_mean"] == metrics["rollout/staleness_max"] == 0.0
    batch = t.prepare_batch(2)  # drawn by the weights after one update
    assert batch.rollout.weights_version.tolist() == [1] * len(batch.rollout)
    assert batch.metrics["rollout/staleness_max"] == 0.0


@pytest.mark.parametrize("kind", ["tis", "mis"])
def test_decoupled_loss_against_a_hand_computed_reference(kind):
    """Two rows of two units drawn by stale weights (behaviour), the proximal log-probs of the
    weights before the update, the current ones: the clip is on theta / proximal, the weight
    proximal / behaviour, capped at 2 (TIS) or dropped above it (MIS)."""
    cfg = AlgorithmConfig(eps_low=0.2, eps_high=0.2)
    logp = torch.tensor([[-1.0, -0.5], [-2.0, -0.3]])
    proximal = torch.tensor([[-1.2, -0.5], [-1.8, -0.3]])
    behaviour = torch.tensor([[-1.0, -1.6], [-1.8, -0.2]])
    adv, mask, weights = torch.tensor([1.0, -0.5]), torch.ones(2, 2), torch.full((2, 2), 0.25)
    w, capped = importance_weights(proximal, behaviour, kind, 2.0)
    terms = policy_loss(logp, proximal, adv, mask, weights, cfg, is_weight=w)
    # row 0 (A = 1): unit 0 ratio e^0.2 > 1.2, clipped: -1.2, weight e^-0.2;
    #                unit 1 ratio 1: -1, weight e^1.1 > 2 (TIS: 2, MIS: 0)
    # row 1 (A = -0.5): unit 0 ratio e^-0.2 < 0.8, unclipped side larger: 0.5 e^-0.2, weight 1;
    #                   unit 1 ratio 1: 0.5, weight e^-0.1
    second = -2.0 if kind == "tis" else 0.0
    expected = (-1.2 * math.exp(-0.2) + second + 0.5 * math.exp(-0.2) + 0.5 * math.exp(-0.1)) / 4
    assert terms.loss.item() == pytest.approx(expected, abs=1e-6)
    assert capped.tolist() == [[False, True], [False, False]]


def test_the_clip_of_stale_rows_is_against_the_current_weights(tmp_path):
    """A batch drawn before an update and trained after it: the proximal log-probs are the
    updated weights' (recomputed), so the logged gap to the behaviour log-probs is the staleness's,
    measured here with the policy's own forward."""
    t = trainer(tmp_path, "algorithm.rollout_correction=tis", "algorithm.mu=2", "optim.lr=0.05")
    stale = t.prepare_batch(1)
    t.updater.update(t.prepare_batch(1))  # the weights move one step
    rows = (stale.row_mask & (stale.advantages != 0)).nonzero().flatten()
    r = stale.rollout.select(rows)
    with torch.no_grad():
        current, _ = t.policy.logprobs(t.model, r, slice(None))
    gap = (current.float() - r.rollout_logp).abs()[r.unit_mask.bool()]
    assert gap.max() > 1e-3  # the update moved the log-probs: the comparison can fail
    metrics = t.updater.update(stale)
    assert metrics["rollout/logp_diff_mean"] == pytest.approx(float(gap.mean()), rel=1e-3)
    assert metrics["rollout/logp_diff_max"] == pytest.approx(float(gap.max()), rel=1e-3)


def run(tmp_path, name, *overrides, steps=3, recipe=TINY_RECIPE):
    out = tmp_path / name
    t = Trainer(parse_config(recipe, [f"output_dir={out}", f"max_steps={steps}", "algorithm.rollout_correction=tis",
                                      *overrides]))
    t.train()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return t, lines


def assert_same_run(sync, sync_lines, worker, worker_lines, keys):
    """The same rollouts (lengths, rewards), losses and weights, step by step."""
    for a, b in zip(sync_lines, worker_lines, strict=True):
        for key in keys:
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
        assert b["rollout/staleness_max"] == 0.0
    for (name, p), q in zip(sync.unwrapped.named_parameters(), worker.unwrapped.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_a_worker_at_staleness_0_is_the_synchronous_run(tmp_path, mode):
    """The worker waits for the newest weights: the same rollouts (lengths, rewards), losses and weights."""
    sync, sync_lines = run(tmp_path, "sync")
    worker, worker_lines = run(tmp_path, "worker", f"rollout.mode={mode}", "rollout.max_staleness=0")
    assert_same_run(sync, sync_lines, worker, worker_lines,
                    ("reward_mean", "reward/accuracy", "reward/digit_share", "completion_length", "loss"))


DIFFUSION_RECIPE = {
    "task": "diffusion", "policy": {"model": "tiny:sd3", "height": 32, "width": 32, "num_steps": 4,
                                    "eval_num_steps": 4, "noise_level": 0.7,
                                    "schedule": {"kind": "sliding_window", "size": 1, "shift_every": 1}},
    "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 32}},
    "rewards": {"mean_red": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "image_reward.py")],
    "algorithm": {"group_size": 3}, "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 3},
    "logging": {"report_to": ["none"], "progress": False}, "seed": 0}


def test_async_diffusion_at_staleness_0_is_the_synchronous_run(tmp_path):
    """The worker builds the same pipeline from the recipe and samples each group from its seed, with
    the SDE window of the step it is asked for (it moves every step): the same images' rewards,
    losses and denoiser weights."""
    sync, sync_lines = run(tmp_path, "sync", recipe=DIFFUSION_RECIPE, steps=2)
    worker, worker_lines = run(tmp_path, "worker", "rollout.mode=async", "rollout.max_staleness=0",
                               recipe=DIFFUSION_RECIPE, steps=2)
    assert any(x["loss"] != 0 for x in sync_lines)
    assert_same_run(sync, sync_lines, worker, worker_lines, ("reward_mean", "reward/mean_red", "loss"))


def test_async_keeps_every_row_within_max_staleness(tmp_path):
    """Two steps asked ahead: step k's rows are at most min(k - 1, 2) steps old, none dropped."""
    t, lines = run(tmp_path, "worker", "rollout.mode=async", "rollout.max_staleness=2", steps=4)
    assert [x["rollout/staleness_max"] <= min(x["step"] - 1, 2) for x in lines] == [True] * 4
    assert [x["rollout/stale_dropped"] for x in lines] == [0.0] * 4
    assert not t.collector.worker.process.is_alive() and not t.collector.prefetched


def test_async_asks_max_staleness_steps_ahead_and_a_resumed_run_draws_the_same_prompts(tmp_path):
    """max_staleness 2: after step k the prompts of steps k+1 and k+2 are drawn and asked for (none
    beyond max_steps). A run resumed from step 2's checkpoint holds the prompts drawn ahead and the
    sampler's state (the outcomes of every collected step learnt), and draws step 5 as the run does."""
    t = trainer(tmp_path, "rollout.mode=async", "rollout.max_staleness=2", "max_steps=4", "save_every=0")
    t.collector.worker = RolloutWorker(t.cfg, t.unwrapped, 0)
    try:
        for ahead in ([2, 3], [3, 4]):
            t.train_step()
            assert sorted(t.collector.prefetched) == ahead
            assert [s for s in range(6) if t.collector.worker.asked_for(s)] == ahead
        t.save_checkpoint()
        t.release_output_dir()
        resumed = trainer(tmp_path, "rollout.mode=async", "rollout.max_staleness=2", "max_steps=4", "resume=true")
        assert resumed.step == 2 and resumed.collector.prefetched == t.collector.prefetched
        assert resumed.inputs.sampler.state_dict() == t.inputs.sampler.state_dict()
        assert resumed.inputs.sampler.draw(5, 4) == t.inputs.sampler.draw(5, 4)
        resumed.release_output_dir()
        t.train_step()
        assert sorted(t.collector.prefetched) == [4]  # step 5 is beyond max_steps
    finally:
        t.collector.worker.stop()


@pytest.mark.parametrize("stale_rows", ["drop", "keep"])
def test_rows_older_than_max_staleness_are_dropped_or_kept(tmp_path, stale_rows):
    """max_staleness 0, weights every 4 updates: steps 2-4's rows are drawn by the initial weights, 1-3
    steps older than allowed: drop leaves all 16 of each out (three steps in a row that train nothing,
    which is not a reward that never applies), keep trains them."""
    t, lines = run(tmp_path, "worker", "rollout.mode=async", "rollout.max_staleness=0", "rollout.weights_every=4",
                   f"rollout.stale_rows={stale_rows}", steps=4)
    rows = 4 * 4  # prompts_per_step x group_size
    if stale_rows == "drop":
        assert [x["rollout/stale_dropped"] for x in lines] == [0.0, rows, rows, rows]
        assert [x["sampling/groups"] for x in lines] == [4.0, 0.0, 0.0, 0.0]
        assert [x["loss"] for x in lines[1:]] == [0.0] * 3
    else:
        assert [x["rollout/stale_dropped"] for x in lines] == [0.0] * 4
        assert [x["rollout/staleness_max"] for x in lines] == [0.0, 1.0, 2.0, 3.0]
        assert all(x["loss"] != 0.0 for x in lines[1:])


def test_one_step_off_trains_on_rows_one_step_old(tmp_path):
    t, lines = run(tmp_path, "worker", "rollout.mode=one_step_off")
    assert [x["rollout/staleness_max"] for x in lines] == [0.0, 1.0, 1.0]  # the first step's rows: the initial weights
    assert not t.collector.worker.process.is_alive()


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_a_dead_worker_stops_the_run_after_a_checkpoint_and_resume_starts_a_new_one(tmp_path, monkeypatch, mode):
    kill_reward = Path(__file__).parent / "kill_reward.py"
    monkeypatch.setattr(import_user_module(str(kill_reward)), "_calls", 0)  # counted from this run's first step
    monkeypatch.setenv("MMRL_TEST_KILL_AT", "2")  # during step 2's scoring
    monkeypatch.setenv("MMRL_TEST_KILL_SIGNAL", "children")
    killer = [f"reward_modules=[{TINY_RECIPE['reward_modules'][0]},{kill_reward}]", "rewards.killer.weight=0.0",
              f"rollout.mode={mode}"]
    with pytest.raises(RolloutWorkerDied, match=f"rollout worker .* exited .*rollout.mode={mode}") as err:
        run(tmp_path, "worker", "save_every=10", *killer, steps=4)
    assert any("after step 2, which is saved" in note for note in err.value.__notes__)
    monkeypatch.setenv("MMRL_TEST_KILL_AT", "0")
    t, lines = run(tmp_path, "worker", "resume=true", *killer, steps=4)
    assert t.step == 4 and [x["step"] for x in lines] == [1, 2, 3, 4]
    assert lines[2]["rollout/staleness_max"] == 0.0  # step 3 redrawn by the new worker from the checkpoint's weights


def test_one_step_off_refuses_what_it_cannot_run_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=one_step_off",
                                            "rollout.max_staleness=2", "optim.lora.r=4", "sampling.dynamic=true"]))
    text = str(err.value)
    assert "rollout.max_staleness=2" in text and "optim.lora.r=4" in text and "sampling.dynamic=true" in text


def test_async_refuses_what_it_cannot_run_and_names_the_families_that_work(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", "task=vlm", "rollout.mode=async",
                                            "rollout.max_staleness=-1", "rollout.stale_rows=keep"]))
    text = str(err.value)
    assert "task='vlm' (the rollout worker runs causal_lm and diffusion)" in text
    assert "rollout.max_staleness=-1" in text and "rollout.stale_rows=keep with algorithm.rollout_correction=none" in text
    with pytest.raises(ConfigError, match=r"rollout.mode=async with policy.units=forward_process \(no behaviour"):
        validate(parse_config(DIFFUSION_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=async",
                                                 "policy.units=forward_process"]))
    with pytest.raises(ConfigError, match=r"rollout.weights_every=2 is async's \(rollout.mode=one_step_off\)"):
        validate(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=one_step_off",
                                            "rollout.weights_every=2"]))
