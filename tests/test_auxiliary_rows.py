"""Auxiliary rollout rows (generic engine feature, `Rollout.auxiliary`): the rewards score them
with group ids, then they are dropped; data-set columns reach groups of any size."""

import pytest
import torch

from mmrl.core.rollout import Rollout
from mmrl.core.scoring import score_rollout


def rollout(group_id, auxiliary):
    n = len(group_id)
    return Rollout(group_id=torch.tensor(group_id), prompts=[f"p{g}" for g in group_id],
                   completions=[f"c{i}" for i in range(n)], unit_mask=torch.ones(n, 2),
                   extras={"ids": torch.arange(n)}, auxiliary=torch.tensor(auxiliary) if auxiliary else None)


def test_data_columns_follow_the_groups_whatever_their_size():
    r = rollout([4, 4, 4, 9, 2, 2], None)
    r.columns["answer"] = ["mine"] * 6  # set by the adapter: kept
    r.add_data_columns([{"answer": "a", "x": 1}, {"answer": "b", "x": 2}, {"answer": "c", "x": 3}])
    assert r.columns == {"answer": ["mine"] * 6, "x": [1, 1, 1, 2, 3, 3]}
    with pytest.raises(ValueError, match="3 groups .* 2 prompts"):
        rollout([0, 1, 2], None).add_data_columns([{"x": 1}, {"x": 2}])


def test_score_rollout_sees_groups_and_drops_auxiliary_rows():
    seen = {}

    def count_aux_in_group(prompts, completions, group_id, auxiliary, **columns):
        seen.update(group_id=group_id, auxiliary=auxiliary)
        return [float(sum(a for g2, a in zip(group_id, auxiliary) if g2 == g)) for g in group_id]

    r = rollout([3, 3, 3, 8, 8], [False, False, True, False, False])
    kept, rewards, auxiliary = score_rollout({"n": count_aux_in_group}, r)
    assert seen == {"group_id": [3, 3, 3, 8, 8], "auxiliary": [False, False, True, False, False]}
    assert kept.group_id.tolist() == [3, 3, 8, 8] and kept.extras["ids"].tolist() == [0, 1, 3, 4]
    assert kept.auxiliary is None and kept.completions == ["c0", "c1", "c3", "c4"]
    assert rewards["n"].tolist() == [1.0, 1.0, 0.0, 0.0] and auxiliary["n"].tolist() == [1.0]
    plain = rollout([0, 0], None)
    same, rewards, auxiliary = score_rollout({"n": count_aux_in_group}, plain)
    assert same is plain and seen["auxiliary"] == [False, False] and len(auxiliary["n"]) == 0


def test_engine_columns_are_reserved():
    r = rollout([0, 0], None)
    r.add_data_columns([{"group_id": 5}])
    with pytest.raises(ValueError, match="'group_id' is reserved"):
        score_rollout({"n": lambda prompts, completions, **kw: [0.0, 0.0]}, r)
