"""Prompt sampling: deterministic, epoch-covering, curriculum order (SARI), MMR1 variance weighting."""

import json

import pytest
import torch

from mmrl.config.rollouts import SamplingConfig
from mmrl.core.seeding import derive_seed
from mmrl.data.sampler import PromptSampler, curriculum_order

ROWS = [{"prompt": str(i), "difficulty": (i * 7) % 5} for i in range(10)]  # 0,2,4,1,3,0,2,4,1,3
VARIANCE = SamplingConfig(strategy="variance")


def test_derive_seed_is_stable_and_mixes():
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    assert derive_seed(1, 2, 3) != derive_seed(1, 3, 2) != derive_seed(1, 2)
    seeds = {derive_seed(0, s) for s in range(1000)}
    assert len(seeds) == 1000 and all(0 <= s < 2 ** 63 for s in seeds)
    assert derive_seed(12, 34) == derive_seed(12, 34)


def test_empty_dataset_and_bad_config_error():
    with pytest.raises(ValueError, match="empty"):
        PromptSampler([], SamplingConfig(), 0)
    with pytest.raises(ValueError, match="variance_mix"):
        PromptSampler(ROWS, SamplingConfig(strategy="variance", variance_mix=1.5), 0)


def test_uniform_covers_each_prompt_once_per_epoch_and_is_reproducible():
    a, b = PromptSampler(ROWS, SamplingConfig(), seed=0), PromptSampler(ROWS, SamplingConfig(), seed=0)
    first = a.draw(1, 4) + a.draw(2, 4) + a.draw(3, 2)
    assert sorted(first) == list(range(10))
    assert first == b.draw(1, 4) + b.draw(2, 4) + b.draw(3, 2)
    second = a.draw(4, 10)
    assert sorted(second) == list(range(10)) and second != first  # wrapped: a new epoch, a new order
    assert a.stats()["sampling/epoch"] == 2.0
    assert PromptSampler(ROWS, SamplingConfig(), seed=1).draw(1, 10) != first


def test_uniform_wrap_inside_a_step_does_not_repeat_and_epochs_stay_complete():
    for seed in range(20):
        s = PromptSampler(ROWS, SamplingConfig(), seed)
        epoch0 = s.draw(1, 8)
        step2 = s.draw(2, 4)  # the last 2 of epoch 0, then 2 of epoch 1
        assert len(set(step2)) == 4
        assert sorted(epoch0 + step2[:2]) == list(range(10))
        epoch1 = step2[2:] + s.draw(3, 8)
        assert sorted(epoch1) == list(range(10))


def test_dynamic_attempts_do_not_repeat_prompts():
    for cfg in (SamplingConfig(), VARIANCE, SamplingConfig(curriculum_column="difficulty")):
        s = PromptSampler(ROWS, cfg, seed=0)
        s.draw(0, 7)
        drawn = s.draw(1, 3, attempt=0) + s.draw(1, 3, attempt=1) + s.draw(1, 3, attempt=2)
        assert len(set(drawn)) == 9, cfg
        # a step asking for more prompts than there are repeats only once every prompt is used
        more = s.draw(2, 6) + s.draw(2, 6, attempt=1)
        assert sorted(set(more[:10])) == list(range(10)), cfg


def test_curriculum_easy_to_hard_and_reverse():
    order = curriculum_order(ROWS, "difficulty")
    assert [ROWS[i]["difficulty"] for i in order] == sorted(r["difficulty"] for r in ROWS)
    assert order == [0, 5, 3, 8, 1, 6, 4, 9, 2, 7]  # ties keep data-set order
    assert curriculum_order(ROWS, "difficulty", descending=True) == [2, 7, 4, 9, 1, 6, 3, 8, 0, 5]
    s = PromptSampler(ROWS, SamplingConfig(curriculum_column="difficulty"), 0)
    assert s.draw(1, 4) + s.draw(2, 4) + s.draw(3, 4) == order + order[:2]  # walked, wrapping around
    d = PromptSampler(ROWS, SamplingConfig(curriculum_column="difficulty", curriculum_descending=True), 0)
    assert [ROWS[i]["difficulty"] for i in d.draw(1, 10)] == sorted((r["difficulty"] for r in ROWS),
                                                                   reverse=True)


def test_curriculum_column_must_be_numeric():
    with pytest.raises(ValueError, match="row 0"):
        PromptSampler([{"prompt": "x"}], SamplingConfig(curriculum_column="difficulty"), 0)
    rows = [{"difficulty": 1}, {"difficulty": 2}, {"difficulty": "hard"}]
    with pytest.raises(ValueError, match=r"'difficulty'.*row 2"):
        PromptSampler(rows, SamplingConfig(curriculum_column="difficulty"), 0)


def test_variance_sampling_probabilities_by_hand():
    rows = ROWS[:4]
    s = PromptSampler(rows, SamplingConfig(strategy="variance", variance_mix=0.5, variance_window=2,
                                           variance_score="variance", variance_scaling="none"), 0)
    assert s.probabilities().tolist() == pytest.approx([0.25] * 4)  # nothing seen: all 0.25
    # prompt 0: outcomes 1,0,1,0 -> variance .25; prompt 1: all 1 -> 0; prompt 2: all 0 -> 0;
    # prompt 3: never seen -> the max seen, .25. Sum VPS = .5.
    s.update([0, 1, 2], torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1, 2, 2]))
    s.update([0], torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    p = [0.5 * 0.25 / 0.5 + 0.5 / 4, 0.5 / 4, 0.5 / 4, 0.5 * 0.25 / 0.5 + 0.5 / 4]
    assert p == [0.375, 0.125, 0.125, 0.375]
    assert s.probabilities().tolist() == pytest.approx(p)
    counts = torch.zeros(4)
    for step in range(4000):
        for i in s.draw(step, 1):
            counts[i] += 1
    assert (counts / counts.sum()).tolist() == pytest.approx(p, abs=0.025)  # ~3.5 standard errors
    assert s.stats()["sampling/mean_vps"] == pytest.approx(0.125)


def test_variance_window_and_nan():
    s = PromptSampler(ROWS[:2], SamplingConfig(strategy="variance", variance_window=2, variance_mix=1.0,
                                               variance_score="variance", variance_scaling="none"), 0)
    ids = torch.tensor([0, 0])
    for r in ([1.0, 1.0], [0.0, float("nan")], [0.0, 0.0], [0.0, 0.0]):
        s.update([0], torch.tensor(r), ids)
    assert list(s.outcomes[0]) == [0.0, 0.0, 0.0, 0.0]  # the last 2 * group_size finite rewards
    s.update([0, 1], torch.tensor([0.0, 0.5, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]))
    # prompt 0: 0, 0, 0, .5 -> variance .046875; prompt 1: 1, 0 -> .25
    vps = s.vps().tolist()
    assert vps == pytest.approx([0.046875, 0.25])
    assert s.probabilities().tolist() == pytest.approx([0.046875 / 0.296875, 0.25 / 0.296875])
    zero = PromptSampler(ROWS[:2], SamplingConfig(strategy="variance"), 0)
    zero.update([0, 1], torch.ones(4), torch.tensor([0, 0, 1, 1]))
    assert zero.probabilities().tolist() == pytest.approx([0.5, 0.5])  # all VPS 0: uniform


def reference_mmr1_probabilities(pass_rates, mix):
    """MMR1's trainer by hand: learnability p(1 - p), min-max scaled over the data set with
    1e-8 in the denominator; a share `mix` of the draws by those weights, the rest uniform."""
    w = [p * (1 - p) for p in pass_rates]
    lo, hi = min(w), max(w)
    w = [(x - lo) / (hi - lo + 1e-8) for x in w]
    return [mix * x / sum(w) + (1 - mix) / len(w) for x in w]


def test_variance_sampling_follows_mmr1():
    # the case: pass rates 1/2 and 1/4 are drawn .75 / .25 (raw scores: .54 / .46)
    s = PromptSampler(ROWS[:2], VARIANCE, 0)
    s.update([0, 1], torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]), torch.tensor([0] * 4 + [1] * 4))
    assert s.probabilities().tolist() == pytest.approx([0.75, 0.25])
    assert reference_mmr1_probabilities([0.5, 0.25], 0.5) == pytest.approx([0.75, 0.25])
    raw = PromptSampler(ROWS[:2], SamplingConfig(strategy="variance", variance_scaling="none"), 0)
    raw.update([0, 1], torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]), torch.tensor([0] * 4 + [1] * 4))
    assert raw.probabilities().tolist() == pytest.approx([0.5 * 0.25 / 0.4375 + 0.25, 0.5 * 0.1875 / 0.4375 + 0.25])
    # graded outcomes in [0, 1]: p(1 - p) of the mean, not the variance; five prompts, one unseen
    s = PromptSampler(ROWS[:5], SamplingConfig(strategy="variance", variance_mix=0.7), 0)
    outcomes = [[0.9, 0.7], [0.5, 0.5], [0.0, 0.2], [1.0, 1.0]]
    s.update([0, 1, 2, 3], torch.tensor(outcomes).flatten(), torch.arange(4).repeat_interleave(2))
    rates = [sum(o) / 2 for o in outcomes]
    rates.append(0.5)  # prompt 4 never seen: the largest seen score, p(1 - p) = .25 at p = .5
    assert s.probabilities().tolist() == pytest.approx(reference_mmr1_probabilities(rates, 0.7))
    assert s.vps()[1].item() == pytest.approx(0.25)  # variance 0, but p(1 - p) = .25
    with pytest.raises(ValueError, match=r"variance_score='pass_rate' needs outcomes in \[0, 1\]; prompt 2 got 1.5"):
        s.update([2], torch.tensor([0.0, 1.5]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="variance_scaling"):
        PromptSampler(ROWS, SamplingConfig(strategy="variance", variance_scaling="rank"), 0)


def test_variance_draws_are_deterministic_and_differ_by_step():
    a, b = PromptSampler(ROWS, VARIANCE, 7), PromptSampler(ROWS, VARIANCE, 7)
    for s in (a, b):
        s.update([1, 2], torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    draws = [a.draw(step, 4) for step in range(6)]
    assert draws == [b.draw(step, 4) for step in range(6)]
    assert all(len(set(d)) == 4 for d in draws)
    assert len({tuple(d) for d in draws}) > 1
    c = PromptSampler(ROWS, VARIANCE, 7)
    c.update([1, 2], torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    assert c.draw(3, 4) == draws[3]  # a step's draw depends on (seed, step, attempt, windows)


@pytest.mark.parametrize("cfg", [SamplingConfig(), VARIANCE, SamplingConfig(curriculum_column="difficulty")])
def test_state_dict_round_trip_gives_the_same_draws(cfg):
    a = PromptSampler(ROWS, cfg, 3)
    a.draw(0, 7)
    a.update([1, 2], torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    a.draw(1, 4)  # wraps mid-step for the sequential walk; the next attempt must remember it
    b = PromptSampler(ROWS, cfg, 3)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert a.stats() == b.stats()

    def rest(s):
        out = [s.draw(1, 3, attempt=1)]
        for step in range(2, 7):
            out.append(s.draw(step, 3))
            s.update(out[-1], torch.tensor([float(step % 2), 1.0] * 3), torch.arange(3).repeat_interleave(2))
        return out

    assert rest(a) == rest(b)
    assert a.state_dict() == b.state_dict()


def test_trainer_feeds_the_named_reward_to_the_variance_sampler(tmp_path):
    from helpers import TINY_RECIPE, tiny_overrides

    from mmrl.config.parse import parse_config
    from mmrl.train.loop.trainer import Trainer
    recipe = dict(TINY_RECIPE, sampling={"strategy": "variance", "variance_reward": "digits"})
    with pytest.raises(ValueError, match=r"sampling.variance_reward='digits' is not one of the rewards"):
        Trainer(parse_config(recipe, tiny_overrides(tmp_path)))
    recipe["sampling"]["variance_reward"] = "accuracy"
    t = Trainer(parse_config(recipe, tiny_overrides(tmp_path)))
    seen = []
    update = t.inputs.sampler.update
    t.inputs.sampler.update = lambda indices, outcome, gid: (seen.append(outcome.clone()), update(indices, outcome, gid))[1]
    metrics = t.train_step()
    assert len(seen) == 1 and seen[0].shape == (16,)
    assert float(seen[0].mean()) == pytest.approx(metrics["reward/accuracy"], abs=1e-6)
    assert metrics["reward/digit_share"] > 0.01  # so the weighted total differs from what was fed
