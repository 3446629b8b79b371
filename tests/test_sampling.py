"""Prompt sampling: deterministic, epoch-covering, curriculum order, MMR1 variance weighting."""

import json

import pytest
import torch

from mmrl.config import SamplingConfig
from mmrl.sampling import PromptSampler, curriculum_order, derive_seed

ROWS = [{"prompt": str(i), "difficulty": (i * 7) % 5} for i in range(10)]


def test_derive_seed_is_stable_and_mixes():
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    assert derive_seed(1, 2, 3) != derive_seed(1, 3, 2)
    assert 0 <= derive_seed(5) < 2 ** 63


def test_uniform_covers_each_prompt_once_per_epoch_and_is_reproducible():
    a, b = PromptSampler(ROWS, SamplingConfig(), seed=0), PromptSampler(ROWS, SamplingConfig(), seed=0)
    first = a.draw(1, 4) + a.draw(2, 4) + a.draw(3, 2)
    assert sorted(first) == list(range(10))
    assert first == b.draw(1, 4) + b.draw(2, 4) + b.draw(3, 2)
    assert a.draw(4, 10) != first  # a new epoch, a new order
    assert PromptSampler(ROWS, SamplingConfig(), seed=1).draw(1, 10) != first


def test_dynamic_attempts_do_not_repeat_prompts():
    s = PromptSampler(ROWS, SamplingConfig(), seed=0)
    drawn = s.draw(1, 3, attempt=0) + s.draw(1, 3, attempt=1) + s.draw(1, 3, attempt=2)
    assert len(set(drawn)) == 9


def test_curriculum_easy_to_hard_and_reverse():
    order = curriculum_order(ROWS, "difficulty")
    assert [ROWS[i]["difficulty"] for i in order] == sorted(r["difficulty"] for r in ROWS)
    assert order[:2] == [0, 5]  # ties keep data-set order
    s = PromptSampler(ROWS, SamplingConfig(curriculum_column="difficulty", curriculum_descending=True), 0)
    assert [ROWS[i]["difficulty"] for i in s.draw(1, 10)] == sorted((r["difficulty"] for r in ROWS), reverse=True)


def test_curriculum_column_must_be_numeric():
    with pytest.raises(ValueError, match="row 0"):
        PromptSampler([{"prompt": "x"}], SamplingConfig(curriculum_column="difficulty"), 0)


def test_variance_sampling_probabilities_by_hand():
    rows = ROWS[:4]
    s = PromptSampler(rows, SamplingConfig(strategy="variance", variance_mix=0.5, variance_window=2), 0)
    # prompt 0: outcomes 1,0,1,0 -> variance .25; prompt 1: all 1 -> 0; prompt 2: all 0 -> 0;
    # prompt 3: never seen -> the max seen, .25
    s.update([0, 1, 2], torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1, 2, 2]))
    s.update([0], torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    p = s.probabilities().tolist()
    assert p == pytest.approx([0.5 * 0.5 + 0.125, 0.125, 0.125, 0.5 * 0.5 + 0.125])
    counts = torch.zeros(4)
    for step in range(3000):
        for i in s.draw(step, 1):
            counts[i] += 1
    assert (counts / counts.sum()).tolist() == pytest.approx(p, abs=0.03)


def test_state_dict_round_trip_gives_the_same_draws():
    cfg = SamplingConfig(strategy="variance")
    a = PromptSampler(ROWS, cfg, 3)
    a.update([1, 2], torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    b = PromptSampler(ROWS, cfg, 3)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert [a.draw(s, 3) for s in range(5)] == [b.draw(s, 3) for s in range(5)]
    u1, u2 = PromptSampler(ROWS, SamplingConfig(), 3), PromptSampler(ROWS, SamplingConfig(), 3)
    u1.draw(1, 7)
    u2.load_state_dict(json.loads(json.dumps(u1.state_dict())))
    assert u1.draw(2, 6) == u2.draw(2, 6)
