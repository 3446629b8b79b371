"""The loop: streaming is exact, the on-policy ratio is 1, zero-advantage rows are skipped
without changing the gradient, errors name what broke."""

import math

import pytest
import torch
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.config.parse import ConfigError, parse_config
from mmrl.core.scoring import RewardError, register_reward
from mmrl.train.loop.trainer import Trainer


def make_trainer(tmp_path, *extra):
    return Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path) + list(extra)))


def grads_for(trainer, batch, micro_batch_size):
    trainer.cfg.optim.micro_batch_size = micro_batch_size
    trainer.optimizer.zero_grad(set_to_none=True)
    chunks = trainer.updater.micro_batches(batch)
    sums = trainer.updater.accumulate_gradients(batch, chunks, None, None, with_entropy=True)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return grads, sums


@pytest.mark.parametrize("aggregation,level", [("token_mean", "unit"), ("seq_mean_token_mean", "sequence"),
                                               ("seq_mean_token_sum_norm", "unit")])
def test_streamed_micro_batches_equal_one_batch(tmp_path, aggregation, level):
    t = make_trainer(tmp_path, f"algorithm.aggregation={aggregation}", f"algorithm.ratio_level={level}",
                     "optim.prompts_per_step=4", "algorithm.group_size=4")
    batch = t.prepare_batch(1)
    one, sums_one = grads_for(t, batch, 16)
    streamed, sums_streamed = grads_for(t, batch, 3)
    assert sums_one["units"] > 0
    assert one.keys() == streamed.keys() and one
    for name in one:
        assert torch.allclose(one[name], streamed[name], atol=1e-6, rtol=1e-5), name
    assert sums_one["loss"] == pytest.approx(sums_streamed["loss"], abs=1e-6)


def test_skipping_zero_advantage_rows_keeps_the_gradient(tmp_path):
    t = make_trainer(tmp_path)
    batch = t.prepare_batch(1)
    batch.advantages[:4] = 0.0  # the first group carries no signal
    skipped, _ = grads_for(t, batch, 4)
    assert batch.metrics["skipped_frac"] == pytest.approx(4 / 16)
    t.cfg.algorithm.entropy_coef = 1e-12  # forces every row through the passes, gradient unchanged
    full, _ = grads_for(t, batch, 4)
    for name in full:
        assert torch.allclose(skipped[name], full[name], atol=1e-6), name


def test_first_update_pass_is_exactly_on_policy(tmp_path):
    t = make_trainer(tmp_path, "algorithm.mu=2")
    metrics = t.train_step()
    assert metrics["ratio_max_dev"] == 0.0
    assert metrics["clip_frac"] == 0.0
    assert math.isfinite(metrics["loss"])


def test_kl_with_lora_uses_the_disabled_adapter_as_reference(tmp_path):
    t = make_trainer(tmp_path, "algorithm.beta=0.04", "optim.lora.r=4", "optim.lora.alpha=8", "algorithm.mu=2")
    assert t.reference is None  # no second copy of the model
    first = t.train_step()
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # LoRA B starts at zero: policy == reference
    second = t.train_step()
    assert second["kl"] > 0.0


def test_kl_without_lora_uses_a_frozen_copy(tmp_path):
    t = make_trainer(tmp_path, "algorithm.beta=0.04", "optim.lr=1e-2")
    assert t.reference is not None
    t.train_step()
    assert t.train_step()["kl"] > 0.0


@register_reward("returns_nan")
def _nan_reward(prompts, completions, **kw):
    return [float("nan")] * len(completions)


@register_reward("returns_too_few")
def _short_reward(prompts, completions, **kw):
    return [1.0]


def test_nan_reward_is_an_error_naming_it(tmp_path):
    t = make_trainer(tmp_path, "rewards={returns_nan: {weight: 1.0}}")
    with pytest.raises(RewardError, match="returns_nan.*nan"):
        t.train_step()


def test_wrong_length_reward_is_an_error_naming_it(tmp_path):
    t = make_trainer(tmp_path, "rewards={returns_too_few: {weight: 1.0}}")
    with pytest.raises(RewardError, match="returns_too_few.*1 values for 16"):
        t.train_step()


def test_unknown_reward_and_estimator_are_named(tmp_path):
    # both are found with the whole recipe, before the model loads (mmrl.train.plan.validate)
    with pytest.raises(ConfigError, match="no_such_reward"):
        make_trainer(tmp_path, "rewards={no_such_reward: {weight: 1.0}}")
    with pytest.raises(ConfigError, match="algorithm.estimator: 'no_such_estimator'"):
        make_trainer(tmp_path, "algorithm.estimator=no_such_estimator")


def test_dynamic_sampling_draws_until_groups_vary(tmp_path):
    t = make_trainer(tmp_path / "accuracy", "sampling.dynamic=true", "sampling.dynamic_max_tries=3",
                     "rewards={accuracy: {weight: 1.0}}")
    metrics = t.train_step()  # a random model is never right: every group has zero variance
    assert metrics["sampling/tries"] == 3 and metrics["sampling/groups"] == 0
    t2 = make_trainer(tmp_path / "digit_share", "sampling.dynamic=true")
    assert t2.train_step()["sampling/tries"] == 1  # digit_share varies within groups at once


def test_batch_positions_follow_groups_not_process_order():
    from mmrl.train.loop.batching import batch_positions
    # whole batch in draw order: draw 0 (groups 0, 1), draw 1 (groups 4, 5); this process kept 1 and 5
    batch = torch.tensor([0, 0, 1, 1, 4, 4, 5, 5])
    assert batch_positions(batch, torch.tensor([1, 1, 5, 5])).tolist() == [2, 3, 6, 7]
    assert batch_positions(batch, torch.tensor([], dtype=torch.long)).tolist() == []


def test_dr_grpo_normaliser_is_the_max_completion_length(tmp_path):
    t = make_trainer(tmp_path, "algorithm.aggregation=seq_mean_token_sum_norm")
    assert t.policy.max_units == 8  # a constant, not the widest rollout of the step
    batch = t.prepare_batch(1)
    kept = batch.rollout.unit_mask.bool() & batch.row_mask[:, None]
    rows = int(batch.row_mask.sum())
    assert torch.allclose(batch.weights[kept], torch.full((int(kept.sum()),), 1.0 / (rows * 8)))  # max_new_tokens 8


@pytest.mark.parametrize("clip", [None, 0.5])
def test_warm_start_clips_gradients_when_asked(tmp_path, monkeypatch, clip):
    trainer = make_trainer(tmp_path, "warm_start.steps=3", "warm_start.batch_size=4",
                           f"warm_start.max_grad_norm={'null' if clip is None else clip}")
    norms = []
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, limit: norms.append(limit) or real(params, limit))
    trainer.warm_start()
    assert norms == ([] if clip is None else [clip] * 3)


@pytest.mark.parametrize("schedule,warmup,expected", [
    ("constant", 0, [0.1, 0.1, 0.1, 0.1]),
    ("constant", 2, [0.0, 0.05, 0.1, 0.1]),
    # cosine from lr to 0 over the steps after warm-up: lr * (1 + cos(pi * k / 3)) / 2 for k = 0, 1, 2
    ("cosine", 1, [0.0, 0.1, 0.075, 0.025]),
])
def test_warm_start_learning_rate_schedule(tmp_path, monkeypatch, schedule, warmup, expected):
    trainer = make_trainer(tmp_path, "warm_start.steps=4", "warm_start.batch_size=2", "warm_start.lr=0.1",
                           f"warm_start.schedule={schedule}", f"warm_start.warmup_steps={warmup}")
    seen = []
    real = torch.optim.AdamW.step
    monkeypatch.setattr(torch.optim.AdamW, "step",
                        lambda self, *a, **k: seen.append(self.param_groups[0]["lr"]) or real(self, *a, **k))
    trainer.warm_start()
    assert seen == pytest.approx(expected, abs=1e-9)


def test_train_extremes_trains_each_groups_lowest_and_highest_rows_of_the_same_rollouts(tmp_path):
    """The engine path of algorithm.train_extremes: the same step drawn with and without it; with
    k = 1 each group keeps only its lowest- and highest-advantage rows, at the advantages the
    whole group gave them."""
    extra = ("algorithm.reward_combine=advantage", "algorithm.group_size=4")
    every = make_trainer(tmp_path / "all", *extra).prepare_batch(0)
    ends = make_trainer(tmp_path / "ends", *extra, "algorithm.train_extremes=1").prepare_batch(0)
    assert every.rollout.completions == ends.rollout.completions
    want = torch.zeros_like(every.row_mask)
    for g in every.rollout.group_id.unique():
        rows = [i for i in range(len(want)) if every.rollout.group_id[i] == g and every.row_mask[i]]
        if len(rows) <= 2:
            want[rows] = True
            continue
        ranked = sorted(rows, key=lambda i: (float(every.advantages[i]), i))
        want[[ranked[0], ranked[-1]]] = True
    assert torch.equal(ends.row_mask, want)
    assert torch.allclose(ends.advantages, torch.where(want, every.advantages, 0.0))
    assert ends.row_mask.sum() < every.row_mask.sum()
