"""Group rewards: a reward declared per_group is called once per prompt group with that group's
rows, and the win_rate reward gives Pref-GRPO's win rates (hand-computed references)."""

from pathlib import Path

import pytest
import torch
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.config.parse import parse_config
from mmrl.core.scoring import RewardError, bind_reward, compute_rewards, register_reward
from mmrl.rewards.win_rate import win_rates
from mmrl.train.loop.trainer import Trainer

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
        rate = sum(len(text) / max(len(text) + len(o), 1) if text or o else 0.5 for o in others) / len(others)
        expected.append(round(rate, 3))  # rounded to 3 places by default, as Pref-GRPO
    assert torch.allclose(collected.rewards["win_rate"], torch.tensor(expected), atol=1e-6)
    assert len(set(texts)) > 4


# ----- Pref-GRPO's advantage against its authors' code (CodeGoat24/Pref-GRPO) ------------------------

def authors_pairwise_win_rate(num_items: int, responses: list[dict]) -> list[float]:
    """fastvideo/rewards/unifiedreward_think.py `_pairwise_win_rate`, transcribed (the verdict
    strings reduced to 1 / 2 / anything else)."""
    from collections import defaultdict
    win_count, compare_count = defaultdict(int), defaultdict(int)
    for result in responses:
        idx1, idx2 = result["first_index"], result["second_index"]
        compare_count[idx1] += 1
        compare_count[idx2] += 1
        if result["verdict"] == 1:
            win_count[idx1] += 1
        elif result["verdict"] == 2:
            win_count[idx2] += 1
        else:
            win_count[idx1] += 0.5
            win_count[idx2] += 0.5
    return [round(win_count[i] / compare_count[i], 3) if compare_count[i] > 0 else 0.0 for i in range(num_items)]


def authors_advantages(reward_tensors: dict, reward_weights: dict, num_generations: int, apply_gdpo: bool,
                       adv_clip_max: float = 5.0) -> torch.Tensor:
    """fastvideo/rewards/dispatcher.py `compute_weighted_advantages` with use_group (the branch for
    plain rewards), then the clamp of train_flux.py's loss, transcribed."""
    def _compute_adv(rewards):
        adv_local = torch.zeros_like(rewards)
        for i in range(len(rewards) // num_generations):
            start_idx, end_idx = i * num_generations, (i + 1) * num_generations
            group_rewards = rewards[start_idx:end_idx]
            adv_local[start_idx:end_idx] = (group_rewards - group_rewards.mean()) / (group_rewards.std() + 1e-8)
        return adv_local
    advantages = torch.zeros_like(next(iter(reward_tensors.values())))
    for name in reward_weights:
        advantages = advantages + reward_weights.get(name, 0.0) * _compute_adv(reward_tensors[name])
    if apply_gdpo:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    return torch.clamp(advantages, -adv_clip_max, adv_clip_max)


def test_pref_grpo_advantages_match_the_authors_code():
    """Random verdicts (ties included) for every pair of groups of 2 to 9 images, with and without
    a second pointwise reward and GDPO's renormalisation: mmrl's win_rate (decimals 3) and the
    t2i_pref_grpo recipe's algorithm section give the authors' win rates and advantages."""
    import itertools
    import random

    from mmrl.config.parse import load_recipe
    from mmrl.core.advantages import compute_advantages
    from mmrl.registry import RECIPES
    rng = random.Random(0)
    cases, largest = 0, 0.0
    for trial in range(60):
        g, groups = rng.randint(2, 9), rng.randint(1, 4)
        verdicts = {}
        ours_w, theirs_w = [], []
        for k in range(groups):
            pairs = list(itertools.combinations(range(g), 2))
            responses = [{"first_index": i, "second_index": j, "verdict": rng.choice([1, 2, 2, 1, 0])} for i, j in pairs]
            verdicts.update({(k, r["first_index"], r["second_index"]): r["verdict"] for r in responses})
            theirs_w += authors_pairwise_win_rate(g, responses)
            ours_w += win_rates([(k, i) for i in range(g)],
                                lambda a, b, seen=verdicts: {1: 1.0, 2: 0.0}.get(seen[(a[0], a[1], b[1])], 0.5),
                                decimals=3)
        assert ours_w == pytest.approx(theirs_w, abs=1e-12)
        pointwise = [rng.random() for _ in range(g * groups)]
        gdpo = trial % 2 == 1
        weights = {"win_rate": 0.4, "clip": 0.6} if trial % 3 == 0 else {"win_rate": 1.0}
        rewards = {"win_rate": torch.tensor(theirs_w), "clip": torch.tensor(pointwise)}
        rewards = {k: rewards[k] for k in weights}
        theirs = authors_advantages(rewards, weights, g, gdpo)
        cfg = load_recipe(RECIPES.get("t2i_pref_grpo"), [f"algorithm.group_size={g}",
                                                          f"algorithm.batch_renorm={str(gdpo).lower()}"])
        ours = compute_advantages({k: torch.tensor(v.tolist()) for k, v in rewards.items()}, weights,
                                  torch.arange(groups).repeat_interleave(g), cfg.algorithm).advantages
        largest = max(largest, float((ours - theirs).abs().max()))
        cases += 1
    assert cases == 60 and largest < 1e-5, largest  # 2.0e-6 (float32 advantages up to 5)


def test_colour_shape_preference_judges_by_the_score_with_the_groups_columns(tmp_path):
    """The recipe's in-process judge: win_rate passes the group's colour and shape to it, and its
    verdicts (1 / 0 / 0.5) give the win rates of the colour_shape scores compared by hand."""
    from PIL import Image

    from mmrl.rewards.colour_shape import colour_shape_score
    from mmrl.rewards.win_rate import win_rate
    images = [Image.new("RGB", (32, 32), (245, 245, 245)) for _ in range(3)]
    images[1].paste((220, 40, 40), (8, 8, 24, 24))  # a red square
    images[2].paste((220, 40, 40), (0, 0, 32, 32))  # all red
    scores = [colour_shape_score(im, "red", "square") for im in images]
    expected = [sum(1.0 if scores[i] > scores[j] else 0.0 if scores[i] < scores[j] else 0.5
                    for j in range(3) if j != i) / 2 for i in range(3)]
    got = win_rate(["red square"] * 3, images, prefer="mmrl.rewards.colour_shape:colour_shape_preference",
                   decimals=3, colour=["red"] * 3, shape=["square"] * 3)
    assert got == pytest.approx([round(e, 3) for e in expected]) and scores[1] > max(scores[0], scores[2])
    with pytest.raises(ValueError, match="takes 'colour', which is neither 'prompt' nor a data column"):
        win_rate(["red square"] * 2, images[:2], prefer="mmrl.rewards.colour_shape:colour_shape_preference")


def test_prefer_args_reach_the_preference_function_and_a_wrong_name_is_an_error():
    from PIL import Image

    from mmrl.rewards.colour_shape import colour_shape_score
    from mmrl.rewards.win_rate import win_rate
    # a red disc covering ~0.35 of the canvas against a smaller one: colour_shape's area ceiling
    # decides, so the winner flips between the default ceiling (0.4) and prefer_args' 0.3
    big, small = Image.new("RGB", (16, 16), (255, 255, 255)), Image.new("RGB", (16, 16), (255, 255, 255))
    for img, r in ((big, 5.4), (small, 3.5)):
        for y in range(16):
            for x in range(16):
                if (x - 7.5) ** 2 + (y - 7.5) ** 2 <= r * r:
                    img.putpixel((x, y), (220, 30, 30))
    columns = {"colour": ["red", "red"], "shape": ["circle", "circle"]}
    prefer = "mmrl.rewards.colour_shape:colour_shape_preference"
    expected = [[float(colour_shape_score(a, "red", "circle", area) > colour_shape_score(b, "red", "circle", area))
                 for a, b in ((big, small), (small, big))] for area in ((0.08, 0.4), (0.08, 0.3))]
    assert expected[0] != expected[1]  # the images tell the two ceilings apart
    assert win_rate(["p", "p"], [big, small], prefer, **columns) == expected[0]
    assert win_rate(["p", "p"], [big, small], prefer, prefer_args={"area": [0.08, 0.3]}, **columns) == expected[1]
    with pytest.raises(ValueError, match=r"prefer_args: \['size'\] are not parameters"):
        win_rate(["p", "p"], [big, small], prefer, prefer_args={"size": 3}, **columns)
