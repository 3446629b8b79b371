"""Every advantage estimator against numbers worked out by hand (or by a plain loop here)."""

import math
import statistics

import pytest
import torch

from mmrl.advantages import AdvantageOptions, ESTIMATORS, compute_advantages, group_variance_mask
from mmrl.config import AlgorithmConfig

NAN = float("nan")


def est(name, rewards, groups, **opts):
    adv, mask = ESTIMATORS.get(name)(torch.tensor(rewards), torch.tensor(groups), AdvantageOptions(**opts))
    return adv.tolist(), mask.tolist()


def loop_grpo(rewards, groups, eps=1e-4):
    out = []
    for r, g in zip(rewards, groups):
        members = [x for x, h in zip(rewards, groups) if h == g]
        out.append((r - statistics.mean(members)) / (statistics.stdev(members) + eps))
    return out


def test_grpo_group_std():
    r, g = [1.0, 0.0, 0.0, 1.0, 0.5, 0.2, 0.9, 0.9], [0, 0, 0, 0, 1, 1, 1, 1]
    adv, mask = est("grpo", r, g)
    assert adv == pytest.approx(loop_grpo(r, g), abs=1e-5)
    # by hand: group 0 mean .5, unbiased std sqrt(1/3) = .57735 -> +-0.8659
    assert adv[0] == pytest.approx(0.5 / (0.57735027 + 1e-4), abs=1e-5)
    assert all(mask)


def test_grpo_batch_std_and_no_std():
    r, g = [1.0, 0.0, 3.0, 1.0], [0, 0, 1, 1]
    batch_std = statistics.stdev(r)
    adv, _ = est("grpo", r, g, std="batch")
    assert adv == pytest.approx([0.5 / (batch_std + 1e-4), -0.5 / (batch_std + 1e-4),
                                 1 / (batch_std + 1e-4), -1 / (batch_std + 1e-4)], abs=1e-5)
    adv, _ = est("grpo", r, g, std="none")
    assert adv == pytest.approx([0.5, -0.5, 1.0, -1.0])


def test_nan_rewards_are_left_out_of_the_baseline():
    adv, _ = est("dr_grpo", [1.0, NAN, 0.0, 0.5], [0, 0, 0, 0])
    assert adv == pytest.approx([0.5, 0.0, -0.5, 0.0])


def test_non_contiguous_group_ids():
    adv, _ = est("dr_grpo", [1.0, 5.0, 3.0, 7.0], [7, 2, 7, 2])
    assert adv == pytest.approx([-1.0, -1.0, 1.0, 1.0])


def test_rloo():
    adv, _ = est("rloo", [1.0, 2.0, 6.0, 4.0, 4.0], [0, 0, 0, 1, 1])
    # r_i - mean of the others: 1 - 4, 2 - 3.5, 6 - 1.5; 0, 0
    assert adv == pytest.approx([-3.0, -1.5, 4.5, 0.0, 0.0])


def test_median_pivot_is_masked():
    r = [0.1, 0.9, 0.5, 1.0, 0.0, 0.0, 1.0, 1.0]
    g = [0, 0, 0, 1, 1, 1, 1, 1]
    adv, mask = est("median", r, g, std="none")
    # group 0: median 0.5 (row 2 is the pivot); group 1 sorted 0,0,1,1,1 -> median 1, pivot = the
    # first 1.0 in stable order (row 3)
    assert mask == [True, True, False, False, True, True, True, True]
    assert adv == pytest.approx([-0.4, 0.4, 0.0, 0.0, -1.0, -1.0, 0.0, 0.0])


def test_median_needs_odd_groups():
    with pytest.raises(ValueError, match="odd group size"):
        est("median", [0.0, 1.0], [0, 0])


def test_pairwise():
    adv, _ = est("pairwise", [1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1])
    assert adv == pytest.approx([1.0, -1.0, 0.0, 0.0])
    adv, _ = est("pairwise", [3.0, 1.0, 2.0], [0, 0, 0])
    assert adv == pytest.approx([1.0, -1.0, 0.0])


def test_ngrpo_all_wrong_group_gets_a_signal():
    adv, _ = est("ngrpo", [0.0, 0.0, 0.0], [0, 0, 0], max_reward=1.0)
    # with the virtual 1: values 0,0,0,1 -> mean .25, unbiased std .5 -> (0 - .25) / .5
    assert adv[0] == pytest.approx(-0.25 / (0.5 + 1e-4), abs=1e-6)


def test_step_level_per_unit():
    r = [[1.0, 0.0], [0.0, 0.0], [0.0, 2.0], [1.0, 2.0]]
    adv, _ = est("step", r, [0, 0, 1, 1], std="none")
    assert torch.tensor(adv).flatten().tolist() == pytest.approx([0.5, 0.0, -0.5, 0.0, -0.5, 0.0, 0.5, 0.0])
    with pytest.raises(ValueError, match=r"\[N, U\]"):
        est("step", [1.0, 0.0], [0, 0])


def cfg(**kw):
    return AlgorithmConfig(**kw)


def test_weighted_sum_then_normalise():
    rewards = {"a": torch.tensor([1.0, 0.0, 1.0, 1.0]), "b": torch.tensor([0.0, 1.0, NAN, 0.0])}
    res = compute_advantages(rewards, {"a": 1.0, "b": 0.5}, torch.tensor([0, 0, 1, 1]),
                             cfg(estimator="dr_grpo"))
    # totals 1, .5, 1 (b not applicable), 1 -> advantages .25, -.25, 0, 0
    assert res.total_reward.tolist() == pytest.approx([1.0, 0.5, 1.0, 1.0])
    assert res.advantages.tolist() == pytest.approx([0.25, -0.25, 0.0, 0.0])
    assert res.stats["zero_variance_frac"] == pytest.approx(0.5)


def test_normalise_each_reward_then_sum():
    rewards = {"a": torch.tensor([1.0, 0.0, 3.0, 1.0]), "b": torch.tensor([0.0, 4.0, 1.0, 1.0])}
    res = compute_advantages(rewards, {"a": 1.0, "b": 2.0}, torch.tensor([0, 0, 1, 1]),
                             cfg(estimator="dr_grpo", reward_combine="advantage"))
    # a: .5, -.5, 1, -1 ; b: -2, 2, 0, 0 (x2) -> -3.5, 3.5, 1, -1
    assert res.advantages.tolist() == pytest.approx([-3.5, 3.5, 1.0, -1.0])


def test_drop_zero_variance_and_clip():
    rewards = {"a": torch.tensor([1.0, 1.0, 0.0, 10.0])}
    res = compute_advantages(rewards, {"a": 1.0}, torch.tensor([0, 0, 1, 1]),
                             cfg(estimator="dr_grpo", drop_zero_variance=True, clip_advantage=2.0))
    assert res.row_mask.tolist() == [False, False, True, True]
    assert res.advantages.tolist() == pytest.approx([0.0, 0.0, -2.0, 2.0])
    assert res.stats["num_groups"] == 2


def test_rows_without_any_reward_are_left_out():
    res = compute_advantages({"a": torch.tensor([NAN, 1.0, 0.0])}, {"a": 1.0}, torch.tensor([0, 0, 0]),
                             cfg(estimator="grpo"))
    assert res.row_mask.tolist() == [False, True, True]
    assert res.advantages[0] == 0.0


def test_group_variance_mask():
    m = group_variance_mask(torch.tensor([1.0, 1.0, 0.0, 1.0, NAN, 2.0]), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert m.tolist() == [False, True, False]


def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(KeyError, match="grpo"):
        compute_advantages({"a": torch.zeros(2)}, {"a": 1.0}, torch.tensor([0, 0]), cfg(estimator="nope"))
