"""`algorithm.reward_combine: gate` and `product` against totals worked out by hand, None
(NaN) rows included, and the advantages taken on them."""

import math
import statistics

import pytest
import torch

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.core.advantages import check_reward_combine, combined_total, compute_advantages

NAN = float("nan")
EPS = 1e-4
# rows: both pass / format fails / wrong answer / accuracy None / format None / both None /
# format 0.9 (below a threshold of 1, above one of 0.5)
ACC = [1.0, 1.0, 0.0, NAN, 1.0, NAN, 0.5]
FMT = [1.0, 0.0, 1.0, 1.0, NAN, NAN, 0.9]


def rewards():
    return {"accuracy": torch.tensor(ACC), "format": torch.tensor(FMT)}


def same(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert (math.isnan(a) and math.isnan(e)) or a == pytest.approx(e, abs=1e-6), (actual, expected)


def test_gate_hand_reference():
    # pure gate (Vision-R1: the result reward only where the format is right): format weight 0
    total = combined_total(rewards(), {"accuracy": 2.0, "format": 0.0}, "gate", {"format": 1.0})
    same(total.tolist(), [2.0, 0.0, 0.0, 0.0, 2.0, NAN, 0.0])
    # the gate also pays its own weighted value
    total = combined_total(rewards(), {"accuracy": 2.0, "format": 0.5}, "gate", {"format": 1.0})
    same(total.tolist(), [2.5, 0.0, 0.5, 0.5, 2.0, NAN, 0.45])
    # a lower threshold opens the gate of the last row: 2 * 0.5 + 0.5 * 0.9
    total = combined_total(rewards(), {"accuracy": 2.0, "format": 0.5}, "gate", {"format": 0.5})
    same(total.tolist(), [2.5, 0.0, 0.5, 0.5, 2.0, NAN, 1.45])


def test_two_gates_and_two_results():
    r = {"a": torch.tensor([1.0, 1.0, 1.0, NAN]), "b": torch.tensor([3.0, NAN, 3.0, 3.0]),
         "g": torch.tensor([1.0, 1.0, 0.0, 1.0]), "h": torch.tensor([1.0, 0.0, NAN, NAN])}
    total = combined_total(r, {"a": 1.0, "b": 1.0, "g": 0.0, "h": 0.0}, "gate", {"g": 1.0, "h": 1.0})
    # row 0: both gates open -> 1 + 3; row 1: h shut -> 0; row 2: g shut (h None) -> 0; row 3: open -> 3
    same(total.tolist(), [4.0, 0.0, 0.0, 3.0])


def test_product_hand_reference():
    total = combined_total(rewards(), {"accuracy": 1.0, "format": 1.0}, "product")
    same(total.tolist(), [1.0, 0.0, 0.0, 1.0, 1.0, NAN, 0.45])
    total = combined_total(rewards(), {"accuracy": 2.0, "format": 0.5}, "product")
    same(total.tolist(), [1.0, 0.0, 0.0, 0.5, 2.0, NAN, 0.45])


def test_binary_gate_equals_product_where_both_apply():
    acc = torch.tensor([1.0, 0.0, 1.0, 0.0])
    fmt = torch.tensor([1.0, 1.0, 0.0, 0.0])
    r = {"accuracy": acc, "format": fmt}
    gate = combined_total(r, {"accuracy": 1.0, "format": 0.0}, "gate", {"format": 1.0})
    product = combined_total(r, {"accuracy": 1.0, "format": 1.0}, "product")
    assert gate.tolist() == product.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_gate_broadcasts_over_units():
    r = {"acc": torch.tensor([[1.0, 0.5], [1.0, NAN]]), "fmt": torch.tensor([0.0, 1.0])}
    total = combined_total(r, {"acc": 1.0, "fmt": 0.0}, "gate", {"fmt": 1.0})
    same(total.flatten().tolist(), [0.0, 0.0, 1.0, 0.0])  # row 1 unit 1: acc None, gate pays 0


def loop_grpo(totals, groups):
    """GRPO by hand over the non-NaN totals of each group; NaN rows get 0."""
    out = []
    for r, g in zip(totals, groups):
        if math.isnan(r):
            out.append(0.0)
            continue
        members = [x for x, h in zip(totals, groups) if h == g and not math.isnan(x)]
        out.append((r - statistics.mean(members)) / (statistics.stdev(members) + EPS))
    return out


@pytest.mark.parametrize("combine,weights,expected", [
    ("gate", {"accuracy": 2.0, "format": 0.5}, [2.5, 0.0, 0.5, 0.5, 2.0, NAN, 0.45]),
    ("product", {"accuracy": 1.0, "format": 1.0}, [1.0, 0.0, 0.0, 1.0, 1.0, NAN, 0.45]),
])
def test_advantages_on_the_combined_total(combine, weights, expected):
    groups = [0, 0, 0, 1, 1, 1, 1]
    gates = {"format": 1.0} if combine == "gate" else {}
    res = compute_advantages(rewards(), weights, torch.tensor(groups),
                             AlgorithmConfig(reward_combine=combine, gates=gates))
    same(res.total_reward.tolist(), expected)
    assert res.advantages.tolist() == pytest.approx(loop_grpo(expected, groups), abs=1e-5)
    assert res.row_mask.tolist() == [not math.isnan(x) for x in expected]


def test_validation_names_the_field():
    weights = {"accuracy": 1.0, "format": 0.0}
    with pytest.raises(ValueError, match="algorithm.gates"):
        check_reward_combine("gate", {}, weights)
    with pytest.raises(ValueError, match=r"algorithm.gates: \['fmt'\]"):
        check_reward_combine("gate", {"fmt": 1.0}, weights)
    with pytest.raises(ValueError, match="every reward"):
        check_reward_combine("gate", {"accuracy": 1.0, "format": 1.0}, weights)
    with pytest.raises(ValueError, match="only used with"):
        check_reward_combine("sum", {"format": 1.0}, weights)
    check_reward_combine("gate", {"format": 1.0}, weights)
    check_reward_combine("product", {}, weights)
