"""Video-R1's rewards: T-GRPO's temporal bonus at exact ties and the length bonus, against
hand-written references of the authors' rules (src/r1-v/src/open_r1/trainer/grpo_trainer.py)."""

from fractions import Fraction

import pytest
from mmrl.rewards.length_bonus import length_bonus_reward
from mmrl.rewards.t_grpo import t_grpo_reward


def rows(ordered, shuffled):
    """One group from correct flags of its ordered and shuffled rows: (completions, group_id, auxiliary, answers)."""
    flags = [(False, ok) for ok in ordered] + [(True, ok) for ok in shuffled]
    completions = [f"<answer>{'A' if ok else 'B'}</answer>" for _, ok in flags]
    return completions, [0] * len(flags), [aux for aux, _ in flags], ["A"] * len(flags)


def t_grpo_group(k, g, j, s, min_ratio=0.8, alpha=0.3):
    completions, group_id, auxiliary, answers = rows([True] * k + [False] * (g - k), [True] * j + [False] * (s - j))
    return t_grpo_reward([""] * len(completions), completions, group_id, auxiliary, answer=answers, min_ratio=min_ratio,
                         alpha=alpha, accuracy_args={"mode": "choice"})[:g]


def test_t_grpo_pays_at_the_exact_tie():
    # 3 of 5 ordered vs 3 of 4 shuffled with min_ratio 0.8: 3/5 = 0.8 x 3/4 exactly; Video-R1 pays 0.3
    assert t_grpo_group(3, 5, 3, 4) == [0.3, 0.3, 0.3, 0.0, 0.0]
    assert 3 / 5 < 0.8 * (3 / 4)  # the floating-point comparison mmrl used to make denies it
    assert t_grpo_group(2, 5, 3, 4) == [0.0] * 5  # just below the tie


def test_t_grpo_exhaustive_against_exact_reference():
    """Every outcome for G <= 16 ordered and S <= 8 shuffled binary rollouts: the bonus is paid iff
    k / G >= (4/5) (j / S), i.e. 5 k S >= 4 j G in integers."""
    ties_float_missed = 0
    for g in range(1, 17):
        for s in range(1, 9):
            for k in range(g + 1):
                for j in range(s + 1):
                    pays = 5 * k * s >= 4 * j * g
                    expected = [0.3 if pays else 0.0] * k + [0.0] * (g - k)
                    assert t_grpo_group(k, g, j, s) == expected, (k, g, j, s)
                    ties_float_missed += (5 * k * s == 4 * j * g) and not (k / g >= 0.8 * (j / s))
    assert ties_float_missed == 15  # the exact ties a floating-point comparison denies (as the issue counts)


def test_t_grpo_min_ratio_one_and_graded_scores_are_exact():
    # min_ratio 1.0: p >= q; a tie at 1/2 vs 1/2 pays
    assert t_grpo_group(1, 2, 1, 2, min_ratio=1.0) == [0.3, 0.0]
    assert t_grpo_group(1, 2, 2, 2, min_ratio=1.0) == [0.0, 0.0]
    assert Fraction(repr(0.1)) * 3 == Fraction(3, 10)


def video_r1_length_bonus(acc, lengths):
    """Video-R1's len_control, written out: rewards[idx] += 0.2 for idx with acc > 0.1 when more
    than one such idx exists and 320 <= length <= 512."""
    selected = [i for i, a in enumerate(acc) if a > 0.1]
    return [0.2 if len(selected) > 1 and i in selected and 320 <= lengths[i] <= 512 else 0.0
            for i in range(len(acc))]


@pytest.mark.parametrize("acc, lengths", [
    ([1, 1, 0, 0], [320, 512, 400, 400]),      # both ends of the window, incorrect ones get nothing
    ([1, 0, 0, 0], [400, 400, 400, 400]),      # one correct rollout: no bonus
    ([1, 1, 1, 1], [319, 513, 100, 768]),      # outside the window
    ([0, 0, 0, 0], [400, 400, 400, 400]),
    ([1, 1, 1, 0], [330, 331, 600, 330]),
])
def test_length_bonus_against_video_r1(acc, lengths):
    completions = [f"<answer>{'A' if a else 'B'}</answer>" for a in acc]
    ids = [[7] * n for n in lengths]
    out = length_bonus_reward([""] * 4, completions, group_id=[0] * 4, auxiliary=[False] * 4, completion_ids=ids,
                              answer=["A"] * 4)
    assert out == video_r1_length_bonus(acc, lengths)


def test_length_bonus_per_group_and_auxiliary_rows():
    # group 1 has two correct rows, group 2 only one (its shuffled row, also correct, does not count)
    completions = ["<answer>A</answer>"] * 5
    out = length_bonus_reward([""] * 5, completions, group_id=[1, 1, 2, 2, 2], auxiliary=[False, False, False, True,
                              False], completion_ids=[[0] * 400] * 5, answer=["A", "A", "A", "A", "B"])
    assert out == [0.2, 0.2, 0.0, None, 0.0]


def test_length_bonus_needs_token_ids():
    with pytest.raises(ValueError, match="completion_ids"):
        length_bonus_reward([""], ["<answer>A</answer>"], group_id=[0], auxiliary=[False], answer=["A"])
