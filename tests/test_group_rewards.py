"""Group rewards: a reward declared per_group is called once per prompt group with that group's
rows, and the win_rate reward gives Pref-GRPO's win rates (hand-computed references)."""

from pathlib import Path

import pytest
import torch
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.config.parse import parse_config
from mmrl.core.scoring import RewardError, bind_reward, compute_rewards, register_reward
from mmrl.rewards.win_rate import win_rates
from mmrl.train.trainer import Trainer

PREFER = f"{Path(__file__).parent / 'length_preference.py'}:longer"
SEEN: list[list[int]] = []


@register_reward("group_size_seen", per_group=True)
def group_size_seen(prompts, completions, group_id, offset=0.0, **columns):
    SEEN.append(list(group_id))
    return [len(completions) + offset + k for k in range(len(completions))]


@register_reward("one_value_per_group", per_group=True)
def one_value_per_group(prompts, completions, **columns):
    return [1.0]


def test_soft_win_rates_against_hand_computed_values():
    # lengths 1, 2, 3; p(a beats b) = |a| / (|a| + |b|): row 0 wins 1/3 and 1/4 of its pairs, ...
    rates = win_rates(["a", "bb", "ccc"], lambda a, b: len(a) / (len(a) + len(b)))
    assert rates == pytest.approx([(1 / 3 + 1 / 4) / 2, (2 / 3 + 2 / 5) / 2, (3 / 4 + 3 / 5) / 2])


def test_hard_judge_counts_wins_and_half_ties_as_pref_grpo():
    # a judge answering 1 / 0 / 0.5 (a tie): the authors' counts over n - 1 comparisons
    rates = win_rates([3, 1, 3, 2], lambda a, b: 1.0 if a > b else 0.0 if a < b else 0.5)
    assert rates == pytest.approx([2.5 / 3, 0.0, 2.5 / 3, 1 / 3])


def test_both_orders_cancel_a_first_position_bias():
    biased = lambda a, b: 0.7  # noqa: E731  (prefers whatever is shown first)
    assert win_rates("xyz", biased) == pytest.approx([0.7, 0.5, 0.3])
    assert win_rates("xyz", biased, pairs="both") == pytest.approx([0.5, 0.5, 0.5])


def test_a_preference_outside_zero_one_is_an_error():
    with pytest.raises(ValueError, match="returned 2.0 for a pair"):
        win_rates("xy", lambda a, b: 2.0)


def test_a_group_reward_is_called_once_per_group_with_its_rows():
    SEEN.clear()
    groups = [0, 0, 1, 1, 1, 0]  # rows of a group need not be consecutive
    fn = bind_reward("group_size_seen", {"offset": 10.0})
    out = compute_rewards({"group_size_seen": fn}, ["p"] * 6, list("abcdef"),
                          {"group_id": groups, "auxiliary": [False] * 6})
    assert SEEN == [[0, 0, 0], [1, 1, 1]]
    assert out["group_size_seen"].tolist() == [13, 14, 13, 14, 15, 15]


def test_a_group_reward_of_the_wrong_length_names_the_group():
    with pytest.raises(RewardError, match="'one_value_per_group' raised ValueError: returned 1 values for the 2 rows "
                                          "of group 7"):
        compute_rewards({"one_value_per_group": bind_reward("one_value_per_group")}, ["p"] * 2, ["a", "b"],
                        {"group_id": [7, 7], "auxiliary": [False, False]})


@pytest.mark.parametrize("overlap", [False, True])
def test_win_rate_reward_in_training_is_each_rows_win_rate_in_its_group(tmp_path, overlap):
    recipe = {**TINY_RECIPE, "rewards": {"win_rate": {"weight": 1.0, "args": {"prefer": PREFER}}}}
    t = Trainer(parse_config(recipe, tiny_overrides(tmp_path, **{"scoring.overlap": overlap,
                                                                 "scoring.groups_per_call": 1})))
    collected = t.collector.collect(t.inputs, 1)
    texts, gid = collected.rollout.completions, collected.group_id.tolist()
    expected = []
    for i, text in enumerate(texts):  # mean over the group's other rows of p(row beats other)
        others = [texts[j] for j in range(len(texts)) if gid[j] == gid[i] and j != i]
        expected.append(sum(len(text) / max(len(text) + len(o), 1) if text or o else 0.5 for o in others) / len(others))
    assert torch.allclose(collected.rewards["win_rate"], torch.tensor(expected), atol=1e-6)
    assert len(set(texts)) > 4
