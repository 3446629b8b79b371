"""Every advantage estimator against numbers worked out by hand (or by a plain Python loop here,
never by the module's own helpers)."""

import math
import statistics

import pytest
import torch

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.core.advantages import compute_advantages, group_variance_mask, weighted_total
from mmrl.core.estimators import ADVANTAGE_ESTIMATORS, AdvantageOptions, dr_grpo, grpo, median, ngrpo, pairwise, rloo, step

NAN = float("nan")
EPS = 1e-4
FNS = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo, "median": median, "pairwise": pairwise,
       "ngrpo": ngrpo, "step": step}


def est(name, rewards, groups, **opts):
    adv, mask = FNS[name](torch.tensor(rewards), torch.tensor(groups), AdvantageOptions(**opts))
    assert adv.shape == torch.tensor(rewards).shape and adv.dtype == torch.float32
    assert mask.dtype == torch.bool and mask.shape == (len(groups),)
    return adv.tolist(), mask.tolist()


def loop_grpo(rewards, groups, eps=EPS):
    """Independent reference: plain loops and the statistics module (unbiased stdev)."""
    out = []
    for r, g in zip(rewards, groups):
        members = [x for x, h in zip(rewards, groups) if h == g]
        out.append((r - statistics.mean(members)) / (statistics.stdev(members) + eps))
    return out


def close2d(actual, expected, atol=1e-6):
    """Nested-list comparison (pytest.approx takes flat sequences only)."""
    torch.testing.assert_close(torch.tensor(actual, dtype=torch.float64),
                               torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)
    return True


def cfg(**kw):
    return AlgorithmConfig(**kw)


def test_builtins_are_registered():
    for name, fn in FNS.items():
        assert ADVANTAGE_ESTIMATORS.get(name) is fn
        assert fn.__doc__


# ------------------------------------------------------------------------------------ grpo


def test_grpo_group_std():
    r, g = [1.0, 0.0, 0.0, 1.0, 0.5, 0.2, 0.9, 0.9], [0, 0, 0, 0, 1, 1, 1, 1]
    adv, mask = est("grpo", r, g)
    assert adv == pytest.approx(loop_grpo(r, g), abs=1e-5)
    # by hand: group 0 mean .5, unbiased std sqrt(1/3) = .57735 -> +-0.86588
    assert adv[:4] == pytest.approx([0.86588, -0.86588, -0.86588, 0.86588], abs=1e-5)
    assert all(mask)


def test_grpo_batch_std_and_no_std():
    r, g = [1.0, 0.0, 3.0, 1.0], [0, 0, 1, 1]
    # batch: mean 1.25, squared deviations .0625 + 1.5625 + 3.0625 + .0625 = 4.75, /3 -> std 1.2583057
    s = 1.2583057 + EPS
    adv, _ = est("grpo", r, g, std="batch")
    assert adv == pytest.approx([0.5 / s, -0.5 / s, 1 / s, -1 / s], abs=1e-5)
    adv, _ = est("grpo", r, g, std="none")
    assert adv == pytest.approx([0.5, -0.5, 1.0, -1.0])


def test_grpo_equal_group_and_single_row_group_give_zero():
    adv, _ = est("grpo", [0.7, 0.7, 0.7, 5.0], [0, 0, 0, 1])
    assert adv == [0.0, 0.0, 0.0, 0.0]


def test_bad_std_option():
    with pytest.raises(ValueError, match="group, batch, none"):
        AdvantageOptions(std="global")


# ------------------------------------------------------------------------------------ NaN, ids


def test_nan_rewards_are_left_out_of_the_baseline():
    r, g = [1.0, NAN, 0.0, 0.5], [0, 0, 0, 0]
    # valid 1, 0, .5: mean .5, unbiased std .5
    adv, mask = est("grpo", r, g)
    assert adv == pytest.approx([0.5 / (0.5 + EPS), 0.0, -0.5 / (0.5 + EPS), 0.0], abs=1e-6)
    assert all(mask)
    adv, _ = est("dr_grpo", r, g)
    assert adv == pytest.approx([0.5, 0.0, -0.5, 0.0])
    # rloo: 1 - mean(0, .5) = .75; 0 - mean(1, .5) = -.75; .5 - mean(1, 0) = 0
    adv, _ = est("rloo", r, g)
    assert adv == pytest.approx([0.75, 0.0, -0.75, 0.0])
    # pairwise: row 0 beats both -> 1; row 2 loses both -> -1; row 3 one win one loss -> 0
    adv, _ = est("pairwise", r, g)
    assert adv == pytest.approx([1.0, 0.0, -1.0, 0.0])
    # batch std over the valid values only (1, 0, .5 -> .5)
    adv, _ = est("grpo", [1.0, NAN, 0.0, 0.5, 2.0, 2.0], [0, 0, 0, 0, 1, 1], std="batch")
    vals = [1.0, 0.0, 0.5, 2.0, 2.0]
    s = statistics.stdev(vals) + EPS
    assert adv == pytest.approx([0.5 / s, 0.0, -0.5 / s, 0.0, 0.0, 0.0], abs=1e-6)


def test_all_nan_group():
    adv, mask = est("grpo", [NAN, NAN, 1.0, 0.0], [3, 3, 4, 4], std="none")
    assert adv == pytest.approx([0.0, 0.0, 0.5, -0.5])


def test_non_contiguous_group_ids_and_uneven_sizes():
    r = [1.0, 5.0, 3.0, 7.0, 10.0, 4.0, 6.0]
    g = [7, 2, 7, 2, -3, 7, 2]
    adv, _ = est("dr_grpo", r, g)
    # group 7: 1, 3, 4 (mean 8/3); group 2: 5, 7, 6 (mean 6); group -3: 10
    assert adv == pytest.approx([1 - 8 / 3, -1.0, 3 - 8 / 3, 1.0, 0.0, 4 - 8 / 3, 0.0], abs=1e-6)
    adv, _ = est("grpo", r, g)
    by_hand = {0: (1 - 8 / 3) / (statistics.stdev([1, 3, 4]) + EPS),
               1: -1 / (1 + EPS), 2: (3 - 8 / 3) / (statistics.stdev([1, 3, 4]) + EPS),
               3: 1 / (1 + EPS), 4: 0.0, 5: (4 - 8 / 3) / (statistics.stdev([1, 3, 4]) + EPS), 6: 0.0}
    assert adv == pytest.approx([by_hand[i] for i in range(7)], abs=1e-5)


# ------------------------------------------------------------------------------------ rloo


def test_rloo():
    adv, mask = est("rloo", [1.0, 2.0, 6.0, 4.0, 4.0, 9.0], [0, 0, 0, 1, 1, 5])
    # r_i - mean of the others: 1 - 4, 2 - 3.5, 6 - 1.5; 0, 0; a group of one -> 0
    assert adv == pytest.approx([-3.0, -1.5, 4.5, 0.0, 0.0, 0.0])
    assert all(mask)


# ------------------------------------------------------------------------------------ median


def test_median_group_of_three():
    adv, mask = est("median", [0.1, 0.9, 0.5], [0, 0, 0], std="none", median_scale="std")
    assert mask == [True, True, False]
    assert adv == pytest.approx([-0.4, 0.4, 0.0])
    # ties: stable sort 0 (row 1), 1 (row 0), 1 (row 2) -> pivot row 0, median 1
    adv, mask = est("median", [1.0, 0.0, 1.0], [0, 0, 0], std="none", median_scale="std")
    assert mask == [False, True, True]
    assert adv == pytest.approx([0.0, -1.0, 0.0])
    # all equal: the middle of the stable sort is row 1
    adv, mask = est("median", [2.0, 2.0, 2.0], [0, 0, 0], median_scale="std")
    assert mask == [True, False, True] and adv == [0.0, 0.0, 0.0]


def test_median_group_of_five_with_ties_and_group_std():
    r = [1.0, 0.0, 0.0, 1.0, 1.0, 0.3, 0.1, 0.9, 0.5, 0.7]
    g = [4, 4, 4, 4, 4, 9, 9, 9, 9, 9]
    adv, mask = est("median", r, g, median_scale="std")
    # group 4 stable-sorted: 0 (row 1), 0 (row 2), 1 (row 0), 1 (row 3), 1 (row 4) -> pivot row 0,
    # median 1; std of 1,0,0,1,1 = sqrt(1.2 / 4) = .5477226
    # group 9 sorted .1 .3 .5 .7 .9 -> pivot row 8 (.5); std sqrt(.4 / 4) = .3162278
    s4, s9 = 0.5477226 + EPS, 0.3162278 + EPS
    assert mask == [False, True, True, True, True, True, True, True, False, True]
    assert adv == pytest.approx([0.0, -1 / s4, -1 / s4, 0.0, 0.0,
                                 -0.2 / s9, -0.4 / s9, 0.4 / s9, 0.0, 0.2 / s9], abs=1e-5)


def test_median_nan_rewards():
    # valid 3, 1, 2, 5 -> lower median 2 (row 3) is the pivot; the NaN row gets 0 and stays in
    adv, mask = est("median", [NAN, 3.0, 1.0, 2.0, 5.0], [0, 0, 0, 0, 0], std="none", median_scale="std")
    assert mask == [True, True, True, False, True]
    assert adv == pytest.approx([0.0, 1.0, -1.0, 0.0, 3.0])


def reference_mc_grpo(rewards, size, rescale):
    """MC-GRPO as the authors' trainer computes it (contiguous groups of `size` = G+1), with the
    statistics module: median baseline, advantage / (MAD + 1e-3); with `rescale`, a group's
    non-zero advantages times size / (their number)."""
    out = []
    for start in range(0, len(rewards), size):
        group = rewards[start:start + size]
        med = statistics.median(group)
        mad = statistics.median([abs(x - med) for x in group])
        adv = [(x - med) / (mad + 1e-3) for x in group]
        if rescale:
            nonzero = [a for a in adv if abs(a) > 1e-6]
            adv = [a * size / len(nonzero) if abs(a) > 1e-6 else a for a in adv] if nonzero else adv
        out += adv
    return out


@pytest.mark.parametrize("rescale", [False, True])
def test_median_mad_normaliser_and_rescale_match_the_authors_rule(rescale):
    r = [1.0, 0.0, 0.0, 1.0, 1.0, 0.3, 0.1, 0.9, 0.5, 0.7, 0.2, 0.2, 0.2, 0.9, 0.0]
    g = [4] * 5 + [9] * 5 + [2] * 5
    adv, mask = est("median", r, g, median_rescale=rescale)
    expected = reference_mc_grpo(r, 5, rescale)
    # group 4: median 1, |dev| 0,1,1,0,0 -> MAD 0: A = -1 / 1e-3 on the two zeros;
    # group 9: median .5, |dev| .2 .4 .4 0 .2 -> MAD .2; group 2: median .2, MAD 0 -> +-.7, -.2 / 1e-3
    assert expected[1] == pytest.approx(-1000.0 * (5 / 2 if rescale else 1))
    assert expected[5] == pytest.approx(-0.2 / 0.201 * (5 / 4 if rescale else 1))
    assert adv == pytest.approx(expected, rel=1e-5)
    assert mask == [False, True, True, True, True, True, True, True, False, True, True, False, True, True, True]
    with pytest.raises(ValueError, match="algorithm.median_scale"):
        AdvantageOptions(median_scale="iqr")


def test_median_even_group_is_an_error():
    with pytest.raises(ValueError, match=r"odd group size.*group 4 has size 2"):
        est("median", [0.0, 1.0, 0.0, 1.0, 0.5], [7, 7, 7, 4, 4], median_scale="std")
    with pytest.raises(ValueError, match=r"\[N\]"):
        est("median", [[0.0], [1.0], [0.5]], [0, 0, 0], median_scale="std")


# ------------------------------------------------------------------------------------ pairwise


def test_pairwise_two():
    adv, mask = est("pairwise", [1.0, 0.0, 0.5, 0.5, -2.0, 3.0], [0, 0, 1, 1, 2, 2])
    assert adv == [1.0, -1.0, 0.0, 0.0, -1.0, 1.0]
    assert all(mask)


def test_pairwise_three_and_uneven():
    adv, _ = est("pairwise", [3.0, 1.0, 2.0], [0, 0, 0])
    assert adv == pytest.approx([1.0, -1.0, 0.0])
    # ties: row 0 vs (1, 2): 0 + 1 -> .5; row 1 likewise; row 2: -1 - 1 -> -1; a lone row -> 0
    adv, _ = est("pairwise", [1.0, 1.0, 0.0, 4.0, 5.0, 8.0], [0, 0, 0, 1, 2, 2])
    assert adv == pytest.approx([0.5, 0.5, -1.0, 0.0, -1.0, 1.0])


# ------------------------------------------------------------------------------------ ngrpo


def test_ngrpo_all_wrong_group_gets_negative_advantages():
    adv, _ = est("ngrpo", [0.0, 0.0, 0.0], [0, 0, 0], max_reward=1.0)
    # with the virtual 1: values 0,0,0,1 -> mean .25, squared deviations 3/16 + 9/16 = .75,
    # unbiased var .75 / 3 = .25, std .5 -> (0 - .25) / .5001
    assert adv == pytest.approx([-0.25 / (0.5 + EPS)] * 3, abs=1e-6)
    assert all(a < 0 for a in adv)


def test_ngrpo_mixed_and_all_right_groups():
    adv, _ = est("ngrpo", [1.0, 0.0, 1.0, 1.0, 0.0, 0.0], [0, 0, 1, 1, 2, 2], max_reward=1.0)
    # group 0 + virtual: 1, 0, 1 -> mean 2/3, var (1/9 + 4/9 + 1/9) / 2 = 1/3, std .5773503
    # group 1 + virtual: 1, 1, 1 -> 0
    # group 2 + virtual: 0, 0, 1 -> mean 1/3, std .5773503
    s = 0.5773503 + EPS
    assert adv == pytest.approx([(1 / 3) / s, (-2 / 3) / s, 0.0, 0.0, (-1 / 3) / s, (-1 / 3) / s],
                                abs=1e-5)
    # max_reward 2: group 0 + virtual 1, 0, 2 -> mean 1, std 1 -> 0, -1 / 1.0001
    adv, _ = est("ngrpo", [1.0, 0.0], [0, 0], max_reward=2.0)
    assert adv == pytest.approx([0.0, -1 / (1 + EPS)], abs=1e-6)
    adv, _ = est("ngrpo", [1.0, 0.0], [0, 0], max_reward=2.0, std="none")
    assert adv == pytest.approx([0.0, -1.0])


# ------------------------------------------------------------------------------------ ddof


def test_population_std_divides_by_n():
    """ddof 0 (algorithm.std_ddof: 0): numpy's std, by hand. Group 0: 1, 0, 0, 1 -> mean .5,
    squared deviations 1, var 1 / 4, std .5; the whole batch 1, 0, 0, 1, .5, .5: mean .5, var
    1 / 6; NGRPO's group 1, 0 + virtual 1: mean 2/3, squared deviations 2/3, var 2/9 over 3."""
    r, g = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5], [0, 0, 0, 0, 1, 1]
    adv, _ = est("grpo", r, g, ddof=0)
    s = 0.5 + EPS
    assert adv == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0], abs=1e-6)
    adv, _ = est("grpo", r, g, ddof=0, std="batch")
    s = math.sqrt(1 / 6) + EPS
    assert adv == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0], abs=1e-5)
    adv, _ = est("ngrpo", [1.0, 0.0], [0, 0], max_reward=1.0, ddof=0)
    s = math.sqrt(2 / 9) + EPS
    assert adv == pytest.approx([(1 / 3) / s, (-2 / 3) / s], abs=1e-5)
    adv, _ = est("median", [0.0, 1.0, 3.0], [0, 0, 0], ddof=0, median_scale="std")
    s = math.sqrt(((0 - 4 / 3) ** 2 + (1 - 4 / 3) ** 2 + (3 - 4 / 3) ** 2) / 3) + EPS
    assert adv == pytest.approx([-1 / s, 0.0, 2 / s], abs=1e-5)
    with pytest.raises(ValueError, match="algorithm.std_ddof=2"):
        AdvantageOptions(ddof=2)


# ------------------------------------------------------------------------------------ step, [N, U]


def test_step_level_per_unit():
    r = [[1.0, 0.0], [0.0, 0.0], [0.0, 2.0], [1.0, 2.0]]
    adv, _ = est("step", r, [0, 0, 1, 1], std="none")
    assert close2d(adv, [[0.5, 0.0], [-0.5, 0.0], [-0.5, 0.0], [0.5, 0.0]])
    r = [[1.0, 3.0], [0.0, 1.0], [0.5, NAN], [NAN, 5.0]]
    adv, _ = est("step", r, [0, 0, 0, 0])
    # unit 0: 1, 0, .5 -> mean .5, std .5 ; unit 1: 3, 1, 5 -> mean 3, std 2
    a, b = 0.5 / (0.5 + EPS), 2 / (2 + EPS)
    assert close2d(adv, [[a, 0.0], [-a, -b], [0.0, 0.0], [0.0, b]], atol=1e-6)
    with pytest.raises(ValueError, match=r"\[N, U\]"):
        est("step", [1.0, 0.0], [0, 0])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "pairwise", "ngrpo"])
@pytest.mark.parametrize("std", ["group", "batch", "none"])
def test_estimators_work_column_by_column(name, std):
    gen = torch.Generator().manual_seed(0)
    r = torch.randint(0, 3, (9, 3), generator=gen).float()
    r[2, 1] = NAN
    gid = torch.tensor([5, 5, 1, 1, 1, 5, 8, 8, 1])
    opts = AdvantageOptions(std=std)
    adv, _ = FNS[name](r, gid, opts)
    for u in range(3):
        col, _ = FNS[name](r[:, u].clone(), gid, opts)
        assert torch.allclose(adv[:, u], col, atol=1e-6)


# ------------------------------------------------------------------------------------ combining


def test_weighted_sum_then_normalise():
    rewards = {"a": torch.tensor([1.0, 0.0, 1.0, 1.0, NAN]), "b": torch.tensor([0.0, 1.0, NAN, 0.0, NAN])}
    res = compute_advantages(rewards, {"a": 1.0, "b": 0.5}, torch.tensor([0, 0, 1, 1, 1]),
                             cfg(estimator="dr_grpo"))
    # totals 1, .5, 1 (b not applicable), 1, NaN (nothing applies) -> advantages .25, -.25, 0, 0, 0
    assert res.total_reward[:4].tolist() == pytest.approx([1.0, 0.5, 1.0, 1.0])
    assert math.isnan(res.total_reward[4])
    assert res.advantages.tolist() == pytest.approx([0.25, -0.25, 0.0, 0.0, 0.0])
    assert res.row_mask.tolist() == [True, True, True, True, False]
    st = res.stats
    assert st["num_groups"] == 2.0 and st["zero_variance_frac"] == pytest.approx(0.5)
    # over the 4 kept rows: .25, -.25, 0, 0 -> mean 0, abs mean .125, std sqrt(.125 / 3)
    assert st["advantage_mean"] == pytest.approx(0.0, abs=1e-7)
    assert st["advantage_abs_mean"] == pytest.approx(0.125)
    assert st["advantage_std"] == pytest.approx(0.2041241, abs=1e-6)


def test_weighted_sum_with_grpo():
    rewards = {"acc": torch.tensor([1.0, 0.0, 1.0, 0.0]), "fmt": torch.tensor([1.0, 1.0, 0.0, 1.0])}
    res = compute_advantages(rewards, {"acc": 2.0, "fmt": 0.5}, torch.tensor([0, 0, 0, 0]),
                             cfg(estimator="grpo"))
    totals = [2.5, 0.5, 2.0, 0.5]
    assert res.total_reward.tolist() == pytest.approx(totals)
    assert res.advantages.tolist() == pytest.approx(loop_grpo(totals, [0] * 4), abs=1e-5)


def test_normalise_each_reward_then_sum():
    rewards = {"a": torch.tensor([1.0, 0.0, 3.0, 1.0]), "b": torch.tensor([0.0, 4.0, 1.0, NAN])}
    res = compute_advantages(rewards, {"a": 1.0, "b": 2.0}, torch.tensor([0, 0, 1, 1]),
                             cfg(estimator="dr_grpo", reward_combine="advantage"))
    # a: .5, -.5, 1, -1 ; b: -2, 2, 0 (alone in its group), 0 (NaN); x2 -> -3.5, 3.5, 1, -1
    assert res.advantages.tolist() == pytest.approx([-3.5, 3.5, 1.0, -1.0])
    assert res.total_reward.tolist() == pytest.approx([1.0, 8.0, 5.0, 1.0])
    # with grpo each reward is normalised by its own group std before the weighted sum
    res = compute_advantages(rewards, {"a": 1.0, "b": 2.0}, torch.tensor([0, 0, 1, 1]),
                             cfg(estimator="grpo", reward_combine="advantage", std="none"))
    assert res.advantages.tolist() == pytest.approx([-3.5, 3.5, 1.0, -1.0])
    res = compute_advantages(rewards, {"a": 1.0, "b": 2.0}, torch.tensor([0, 0, 1, 1]),
                             cfg(estimator="grpo", reward_combine="advantage"))
    # a group 0: +-.5 / (std .7071068 + eps); b group 0: -+2 / (2.8284271 + eps), x2
    sa0, sa1, sb0 = 0.7071068 + EPS, 1.4142136 + EPS, 2.8284271 + EPS
    assert res.advantages.tolist() == pytest.approx(
        [0.5 / sa0 - 4 / sb0, -0.5 / sa0 + 4 / sb0, 1 / sa1, -1 / sa1], abs=1e-5)


def test_advantage_combine_ands_the_row_masks():
    rewards = {"a": torch.tensor([0.0, 1.0, 2.0]), "b": torch.tensor([2.0, 1.0, 0.0])}
    res = compute_advantages(rewards, {"a": 1.0, "b": 1.0}, torch.tensor([0, 0, 0]),
                             cfg(estimator="median", reward_combine="advantage", std="none", median_scale="std"))
    # both pick row 1 as the pivot; a: -1, 0, 1 ; b: 1, 0, -1 -> 0, 0, 0
    assert res.row_mask.tolist() == [True, False, True]
    rewards = {"a": torch.tensor([0.0, 1.0, 2.0]), "b": torch.tensor([5.0, 1.0, 3.0])}
    res = compute_advantages(rewards, {"a": 1.0, "b": 1.0}, torch.tensor([0, 0, 0]),
                             cfg(estimator="median", reward_combine="advantage", std="none", median_scale="std"))
    # a pivots row 1, b pivots row 2 (3 is the median of 5, 1, 3); row 0: -1 + 2 = 1
    assert res.row_mask.tolist() == [True, False, False]
    assert res.advantages.tolist() == pytest.approx([1.0, 0.0, 0.0])


def test_mixed_shapes_broadcast():
    rewards = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([[0.0, 1.0], [1.0, NAN]])}
    total = weighted_total(rewards, {"a": 1.0, "b": 2.0})
    assert total.tolist() == [[1.0, 3.0], [2.0, 0.0]]
    res = compute_advantages(rewards, {"a": 1.0, "b": 2.0}, torch.tensor([0, 0]),
                             cfg(estimator="dr_grpo"))
    # unit 0: 1, 2 -> -.5, .5 ; unit 1: 3, 0 -> 1.5, -1.5
    assert close2d(res.advantages.tolist(), [[-0.5, 1.5], [0.5, -1.5]])
    res = compute_advantages(rewards, {"a": 1.0, "b": 2.0}, torch.tensor([0, 0]),
                             cfg(estimator="dr_grpo", reward_combine="advantage"))
    # a: .5, -.5 in both units ; b: unit 0 -.5, .5 (x2) ; unit 1 NaN left out -> 0
    assert close2d(res.advantages.tolist(), [[-0.5, 0.5], [0.5, -0.5]])
    with pytest.raises(ValueError, match="same N and U"):
        weighted_total({"a": torch.zeros(2, 3), "b": torch.zeros(2, 4)}, {"a": 1.0, "b": 1.0})


def test_drop_zero_variance_and_clip():
    rewards = {"a": torch.tensor([1.0, 1.0, 0.0, 10.0, 3.0, NAN, 3.0])}
    res = compute_advantages(rewards, {"a": 1.0}, torch.tensor([0, 0, 1, 1, 2, 2, 2]),
                             cfg(estimator="dr_grpo", drop_zero_variance=True, clip_advantage=2.0))
    # group 0 (1, 1) and group 2 (3, NaN, 3) have no variance; group 1: -5, 5 clipped to -+2
    assert res.row_mask.tolist() == [False, False, True, True, False, False, False]
    assert res.advantages.tolist() == pytest.approx([0.0, 0.0, -2.0, 2.0, 0.0, 0.0, 0.0])
    st = res.stats
    assert st["num_groups"] == 3.0
    assert st["zero_variance_frac"] == pytest.approx(2 / 3)
    assert st["advantage_mean"] == pytest.approx(0.0)
    assert st["advantage_abs_mean"] == pytest.approx(2.0)
    assert st["advantage_std"] == pytest.approx(math.sqrt(8.0))
    # without the filter the zero-variance rows stay in (with advantage 0) and the frac is the same
    res = compute_advantages(rewards, {"a": 1.0}, torch.tensor([0, 0, 1, 1, 2, 2, 2]),
                             cfg(estimator="dr_grpo"))
    assert res.row_mask.tolist() == [True, True, True, True, True, False, True]
    assert res.advantages.tolist() == pytest.approx([0.0, 0.0, -5.0, 5.0, 0.0, 0.0, 0.0])
    assert res.stats["zero_variance_frac"] == pytest.approx(2 / 3)


def test_clip_with_grpo_batch_std():
    rewards = {"r": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])}
    res = compute_advantages(rewards, {"r": 1.0}, torch.tensor([0] * 8),
                             cfg(estimator="grpo", clip_advantage=1.5))
    # mean 1/8, std sqrt((7/64 + 49/64) / 7) = sqrt(1/8) = .3535534 -> .875 / .3536 = 2.47 -> 1.5
    s = 0.3535534 + EPS
    assert res.advantages.tolist() == pytest.approx([-0.125 / s] * 7 + [1.5], abs=1e-5)


def test_drop_zero_variance_per_unit():
    rewards = {"r": torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 1.0], [0.0, 3.0]])}
    res = compute_advantages(rewards, {"r": 1.0}, torch.tensor([0, 0, 1, 1]),
                             cfg(estimator="step", std="none", drop_zero_variance=True))
    # group 0 equal in every unit -> dropped; group 1 differs in unit 1 -> kept
    assert res.row_mask.tolist() == [False, False, True, True]
    assert close2d(res.advantages.tolist(), [[0.0, 0.0], [0.0, 0.0], [0.0, -1.0], [0.0, 1.0]])
    assert res.stats["zero_variance_frac"] == pytest.approx(0.5)


def test_rows_without_any_reward_are_left_out():
    res = compute_advantages({"a": torch.tensor([NAN, 1.0, 0.0])}, {"a": 1.0}, torch.tensor([0, 0, 0]),
                             cfg(estimator="grpo"))
    assert res.row_mask.tolist() == [False, True, True]
    assert res.advantages[0] == 0.0
    res = compute_advantages({"a": torch.tensor([[NAN, NAN], [1.0, NAN], [0.0, 2.0]])}, {"a": 1.0},
                             torch.tensor([0, 0, 0]), cfg(estimator="step", std="none"))
    assert res.row_mask.tolist() == [False, True, True]
    assert close2d(res.advantages.tolist(), [[0.0, 0.0], [0.5, 0.0], [-0.5, 0.0]])


def test_median_pivot_through_compute_advantages():
    res = compute_advantages({"a": torch.tensor([0.1, 0.9, 0.5, 1.0, 1.0, 1.0])}, {"a": 1.0},
                             torch.tensor([3, 3, 3, 8, 8, 8]),
                             cfg(estimator="median", std="none", median_scale="std", drop_zero_variance=True))
    assert res.row_mask.tolist() == [True, True, False, False, False, False]
    assert res.advantages.tolist() == pytest.approx([-0.4, 0.4, 0.0, 0.0, 0.0, 0.0])


def test_group_variance_mask():
    m = group_variance_mask(torch.tensor([1.0, 1.0, 0.0, 1.0, NAN, 2.0]), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert m.tolist() == [False, True, False]
    # entries follow the sorted ids (-1, 4, 9)
    m = group_variance_mask(torch.tensor([1.0, 2.0, 5.0, 5.0, 0.0, 1.0]), torch.tensor([9, 9, 4, 4, -1, -1]))
    assert m.tolist() == [True, False, True]
    m = group_variance_mask(torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]]),
                            torch.tensor([0, 0, 1, 1]))
    assert m.tolist() == [False, True]


def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(KeyError, match=r"unknown advantage estimator 'nope'.*dr_grpo.*grpo.*median"):
        compute_advantages({"a": torch.zeros(2)}, {"a": 1.0}, torch.tensor([0, 0]), cfg(estimator="nope"))


# ------------------------------------------------------------------------------ best-of-N rows


def dance_grpo_selection(vq, mq, group_size, bestofn, vq_coef=1.0, mq_coef=1.0):
    """DanceGRPO's train_grpo_hunyuan.py, one prompt per process: each reward normalised over the
    group ((r - mean) / (std + 1e-8), unbiased std), total_scores = vq_coef A_vq + mq_coef A_mq,
    the rows at sorted[:bestofn // 2] and sorted[-bestofn // 2:] train. Written with lists."""
    chosen, advantages = set(), []
    for start in range(0, len(vq), group_size):
        rows = range(start, start + group_size)
        a_vq = [(vq[i] - statistics.mean(vq[start:start + group_size]))
                / (statistics.stdev(vq[start:start + group_size]) + 1e-8) for i in rows]
        a_mq = [(mq[i] - statistics.mean(mq[start:start + group_size]))
                / (statistics.stdev(mq[start:start + group_size]) + 1e-8) for i in rows]
        scores = [vq_coef * a + mq_coef * b for a, b in zip(a_vq, a_mq)]
        advantages += scores
        ranked = sorted(rows, key=lambda i: scores[i - start])
        chosen |= set(ranked[:bestofn // 2]) | set(ranked[-(bestofn // 2):])
    return chosen, advantages


def test_train_extremes_keeps_the_rows_dance_grpo_trains():
    gen = torch.Generator().manual_seed(3)
    vq, mq = torch.rand(24, generator=gen).tolist(), torch.rand(24, generator=gen).tolist()
    chosen, expected = dance_grpo_selection(vq, mq, group_size=12, bestofn=6, vq_coef=1.0, mq_coef=0.5)
    res = compute_advantages({"vq": torch.tensor(vq), "mq": torch.tensor(mq)}, {"vq": 1.0, "mq": 0.5},
                             torch.arange(2).repeat_interleave(12),
                             cfg(reward_combine="advantage", eps=1e-8, train_extremes=3))
    assert set(res.row_mask.nonzero().flatten().tolist()) == chosen and len(chosen) == 12
    # the trained rows keep the advantage of the whole group; the others get 0
    kept = [expected[i] if i in chosen else 0.0 for i in range(24)]
    assert res.advantages.tolist() == pytest.approx(kept, abs=1e-5)


def test_train_extremes_ties_and_small_groups():
    rewards = {"r": torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.5, 7.0, 8.0])}
    res = compute_advantages(rewards, {"r": 1.0}, torch.tensor([0, 0, 0, 0, 0, 0, 1, 1]),
                             cfg(train_extremes=2))
    # group 0 sorted stably: 1, 3 (0.0), 5 (0.5), 0, 2, 4 (1.0) -> lowest 1, 3; highest 2, 4.
    # group 1 has 2 <= 2k rows: both train
    assert res.row_mask.tolist() == [False, True, True, True, True, False, True, True]


def test_train_extremes_by_reward_differs_from_by_advantage():
    # a's spread is tiny, b's large: normalised separately, row 1 has the top advantage, row 3 the top total
    rewards = {"a": torch.tensor([0.0, 0.1, 0.0, 0.0]), "b": torch.tensor([0.0, 1.0, 1.5, 2.0])}
    common = dict(reward_combine="advantage", train_extremes=1)
    by_adv = compute_advantages(rewards, {"a": 1.0, "b": 1.0}, torch.zeros(4, dtype=torch.long), cfg(**common))
    by_reward = compute_advantages(rewards, {"a": 1.0, "b": 1.0}, torch.zeros(4, dtype=torch.long),
                                   cfg(train_extremes_by="reward", **common))
    assert by_adv.row_mask.tolist() == [True, True, False, False]
    assert by_reward.row_mask.tolist() == [True, False, False, True]


def test_train_extremes_ranks_per_unit_advantages_by_their_row_mean():
    rewards = {"r": torch.tensor([[0.0, 3.0], [1.0, 1.0], [2.0, -2.0], [0.5, 0.6]])}
    res = compute_advantages(rewards, {"r": 1.0}, torch.zeros(4, dtype=torch.long),
                             cfg(estimator="dr_grpo", train_extremes=1))
    # per-unit advantages (unit means .875, .65): row means .7375, .2375, -.7625, -.2125 -> rows 0, 2
    assert res.row_mask.tolist() == [True, False, True, False]
