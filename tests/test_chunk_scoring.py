"""Scoring while generating (`scoring.overlap`): the same per-row rewards and the same weights as
scoring after the whole rollout, the rewards run in the background thread, and a reward's error
reaches the main thread with its message."""

import threading

import pytest
import torch
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.config.parse import ConfigError, parse_config
from mmrl.core.scoring import RewardError, register_reward
from mmrl.train.loop.collect import generation_calls
from mmrl.train.loop.trainer import Trainer

CALLS: list[tuple[str, int]] = []  # (thread name, rows) of each call of `row_digits`


@register_reward("row_digits")
def row_digits(prompts, completions, group_id, **columns):
    """Digits in the completion plus a small amount per group: wrong if rows or groups are mixed up."""
    CALLS.append((threading.current_thread().name, len(completions)))
    return [sum(ch.isdigit() for ch in c) + 0.01 * g for c, g in zip(completions, group_id)]


@register_reward("two_digits")
def two_digits(prompts, completions, **columns):
    """1 for a completion with at least two digits: some groups of a random model vary, others not."""
    return [float(sum(ch.isdigit() for ch in c) >= 2) for c in completions]


@register_reward("explodes_on_second_group")
def explodes_on_second_group(prompts, completions, group_id, **columns):
    if 1 in group_id:
        raise ValueError("cannot score group 1")
    return [0.0] * len(completions)


def trainer(tmp_path, overlap, rewards=("row_digits", "digit_share"), per_call=1, **extra):
    recipe = {**TINY_RECIPE, "rewards": {name: {"weight": 1.0} for name in rewards}}
    return Trainer(parse_config(recipe, tiny_overrides(tmp_path, **{
        "scoring.overlap": overlap, "scoring.groups_per_call": per_call, "optim.prompts_per_step": 4, **extra})))


def test_generation_calls_cover_the_groups_in_order():
    assert generation_calls(range(4, 10), 4) == [range(4, 8), range(8, 10)]
    assert generation_calls(range(4, 10), 0) == [range(4, 10)]


@pytest.mark.parametrize("per_call", [1, 3])
def test_overlapped_scoring_equals_scoring_after_the_rollout(tmp_path, per_call):
    collected, weights = {}, {}
    for overlap in (False, True):
        CALLS.clear()
        t = trainer(tmp_path / f"collect-{overlap}", overlap, per_call=per_call)
        collected[overlap] = t.collector.collect(t.inputs, 1)
        calls = list(CALLS)
        t = trainer(tmp_path / f"train-{overlap}", overlap, per_call=per_call)
        for _ in range(2):
            t.train_step()
        weights[overlap] = {k: v.clone() for k, v in t.model.state_dict().items()}
        if overlap:  # one call per generation call, each in the scoring thread
            assert [n for n, _ in calls] and all(n.startswith("mmrl-reward") for n, _ in calls)
            assert [rows for _, rows in calls] == [4 * per_call] * (4 // per_call) + ([4 * (4 % per_call)] if 4 % per_call else [])
        else:  # the whole rollout at once, in the main thread
            assert calls == [(threading.main_thread().name, 16)]
    serial, overlapped = collected[False], collected[True]
    assert serial.rollout.completions == overlapped.rollout.completions
    assert serial.rewards.keys() == overlapped.rewards.keys()
    for name in serial.rewards:
        assert torch.equal(serial.rewards[name], overlapped.rewards[name]), name
    assert torch.equal(serial.group_id, overlapped.group_id)
    assert serial.rewards["row_digits"].unique().numel() > 4  # the rows differ: a mix-up would show
    for name, value in weights[False].items():
        assert torch.equal(value, weights[True][name]), name


def test_the_rollouts_do_not_depend_on_the_groups_per_call(tmp_path):
    collected = {per_call: trainer(tmp_path / str(per_call), False, per_call=per_call) for per_call in (0, 1)}
    collected = {k: t.collector.collect(t.inputs, 1) for k, t in collected.items()}
    assert collected[0].rollout.completions == collected[1].rollout.completions
    assert torch.equal(collected[0].rewards["row_digits"], collected[1].rewards["row_digits"])


def test_dynamic_sampling_draws_the_same_groups_overlapped(tmp_path):
    collected = {}
    for overlap in (False, True):
        t = trainer(tmp_path / str(overlap), overlap, rewards=("two_digits",), **{
            "sampling.dynamic": True, "sampling.dynamic_max_tries": 3})
        collected[overlap] = t.collector.collect(t.inputs, 1)
    serial, overlapped = collected[False], collected[True]
    assert serial.metrics["sampling/tries"] == overlapped.metrics["sampling/tries"] > 1  # groups were drawn again
    assert overlapped.metrics["sampling/groups"] > 0
    assert torch.equal(serial.group_id, overlapped.group_id)
    assert torch.equal(serial.rewards["two_digits"], overlapped.rewards["two_digits"])
    assert serial.rollout.completions == overlapped.rollout.completions


def test_a_reward_error_in_the_scoring_thread_reaches_the_step_with_its_message(tmp_path):
    t = trainer(tmp_path, True, rewards=("explodes_on_second_group",))
    with pytest.raises(RewardError, match="reward 'explodes_on_second_group' raised ValueError: cannot score group 1"):
        t.train_step()


def test_groups_per_call_must_not_be_negative(tmp_path):
    with pytest.raises(ConfigError, match="scoring.groups_per_call"):
        trainer(tmp_path, True, per_call=-1)


def test_t_grpo_auxiliary_rows_are_scored_with_their_group_in_every_call(tmp_path):
    from test_video import VIDEO_RECIPE
    collected = {}
    for overlap in (False, True):
        t = Trainer(parse_config(VIDEO_RECIPE, tiny_overrides(tmp_path / str(overlap), **{
            "scoring.overlap": overlap, "scoring.groups_per_call": 1})))
        collected[overlap] = t.collector.collect(t.inputs, 1)
    serial, overlapped = collected[False], collected[True]
    assert len(overlapped.rollout) == 9 and overlapped.rollout.auxiliary is None  # the shuffled rows dropped
    for name in serial.rewards:
        assert torch.equal(serial.rewards[name], overlapped.rewards[name]), name
    for key in ("reward/t_grpo/groups", "auxiliary/reward/digit_share"):
        assert serial.metrics[key] == overlapped.metrics[key], key
    assert overlapped.metrics["reward/t_grpo/groups"] == 3.0
