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
from mmrl.train.rollout_worker import RolloutWorkerDied
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


def run(tmp_path, name, *overrides, steps=3):
    out = tmp_path / name
    t = Trainer(parse_config(TINY_RECIPE, [f"output_dir={out}", f"max_steps={steps}", "algorithm.rollout_correction=tis",
                                           *overrides]))
    t.train()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return t, lines


def test_one_step_off_at_staleness_0_is_the_synchronous_run(tmp_path):
    """The worker waits for the newest weights: the same rollouts (lengths, rewards), losses and weights."""
    sync, sync_lines = run(tmp_path, "sync")
    worker, worker_lines = run(tmp_path, "worker", "rollout.mode=one_step_off", "rollout.max_staleness=0")
    for a, b in zip(sync_lines, worker_lines, strict=True):
        for key in ("reward_mean", "reward/accuracy", "reward/digit_share", "completion_length", "loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
        assert b["rollout/staleness_max"] == 0.0
    for (name, p), q in zip(sync.unwrapped.named_parameters(), worker.unwrapped.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name


def test_one_step_off_trains_on_rows_one_step_old(tmp_path):
    t, lines = run(tmp_path, "worker", "rollout.mode=one_step_off")
    assert [x["rollout/staleness_max"] for x in lines] == [0.0, 1.0, 1.0]  # the first step's rows: the initial weights
    assert not t.collector.worker.process.is_alive()


def test_a_dead_worker_stops_the_run_after_a_checkpoint_and_resume_starts_a_new_one(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRL_TEST_KILL_AT", "2")  # during step 2's scoring
    monkeypatch.setenv("MMRL_TEST_KILL_SIGNAL", "children")
    killer = [f"reward_modules=[{TINY_RECIPE['reward_modules'][0]},{Path(__file__).parent / 'kill_reward.py'}]",
              "rewards.killer.weight=0.0"]
    with pytest.raises(RolloutWorkerDied, match="rollout worker .* exited") as err:
        run(tmp_path, "worker", "rollout.mode=one_step_off", "save_every=10", *killer, steps=4)
    assert any("after step 2, which is saved" in note for note in err.value.__notes__)
    monkeypatch.setenv("MMRL_TEST_KILL_AT", "0")
    t, lines = run(tmp_path, "worker", "rollout.mode=one_step_off", "resume=true", *killer, steps=4)
    assert t.step == 4 and [x["step"] for x in lines] == [1, 2, 3, 4]
    assert lines[2]["rollout/staleness_max"] == 0.0  # step 3 redrawn by the new worker from the checkpoint's weights


def test_one_step_off_refuses_what_it_cannot_run_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=one_step_off",
                                            "rollout.max_staleness=2", "optim.lora.r=4", "sampling.dynamic=true"]))
    text = str(err.value)
    assert "rollout.max_staleness=2" in text and "optim.lora.r=4" in text and "sampling.dynamic=true" in text
