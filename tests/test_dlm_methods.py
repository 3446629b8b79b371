"""SPG, ESPO, TraceRL and AGRPO for masked diffusion LMs: their views against plain masked forwards,
their bounds, weights and losses against small hand-written references, and a training step each."""

import math
from pathlib import Path

import pytest
import torch
from helpers import on_policy_step_changes

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.config.parse import parse_config
from mmrl.core.objectives import sandwiched_loss
from mmrl.core.regularisers import TermInputs, sequence_kl_term
from mmrl.tasks.dlm.bound_estimators import sandwich_bounds, spg_masks
from mmrl.tasks.dlm.config import DLMConfig
from mmrl.tasks.dlm.estimators import LOGP_ESTIMATORS, EstimatorArgs, EstimatorInputs, view_seed
from mmrl.tasks.dlm.policy import DLMPolicy
from mmrl.tasks.dlm.trajectory_estimators import agrpo_unit_weights, collapse_steps
from mmrl.train.loop.trainer import Trainer

PROMPTS = ["12+34=", "5+6="]
ARGS = {"spg_views": 2, "espo_samples": 2, "trace_shrink": 2, "agrpo_samples": 2, "block_length": 4}


def make_policy(**kw):
    return DLMPolicy(DLMConfig(model="tiny:dlm-char", tiny_args={"hidden": 32, "layers": 1, "heads": 2},
                               **{"gen_length": 8, "block_length": 4, "steps": 4, **kw}))


def inputs_of(batch, **args):
    ex = batch.extras
    gens = [torch.Generator().manual_seed(view_seed(int(s), int(ex["mask_pass"]))) for s in ex["mask_seed"]]
    return EstimatorInputs(gens, ex["prompt_mask"], ex["completion_ids"].shape[1], batch.unit_mask.sum(1).long(),
                           EstimatorArgs(**{**ARGS, **args}), ex["completion_step"], ex["completion_entropy"])


def masked_logps(p, ex, masked, temperature=1.0):
    """log softmax(z / T)(y_u) of every completion token with the positions `masked` [B, C] replaced
    by the mask token (prompt visible), from a plain forward of the model."""
    ids = torch.cat([ex["prompt_ids"], ex["completion_ids"].masked_fill(masked, p.mask_id)], 1)
    attention = torch.cat([ex["prompt_mask"], torch.ones_like(ex["completion_ids"])], 1)
    logits = p.model(input_ids=ids, attention_mask=attention,
                     position_ids=(attention.cumsum(-1) - 1).clamp(min=0)).logits.float()
    return torch.log_softmax(logits[:, ex["prompt_ids"].shape[1]:] / temperature, -1).gather(
        -1, ex["completion_ids"][..., None]).squeeze(-1)


@pytest.mark.parametrize("name", ["spg", "espo", "tracerl", "agrpo"])
def test_the_views_match_plain_masked_forwards(name):
    p = make_policy(estimator=name, temperature=0.7, **ARGS)
    batch = p.rollout(PROMPTS, 2, seeds=[1, 2])
    with torch.no_grad():
        logp, _ = p.logprobs(p.model, batch)
        ref = torch.zeros_like(logp)
        for v in LOGP_ESTIMATORS.get(name)(inputs_of(batch, temperature=0.7)):
            ref += torch.where(v.scores, v.weight[:, None] * masked_logps(p, batch.extras, v.masked, v.temperature), 0.0)
    assert torch.allclose(logp, ref * batch.unit_mask, atol=1e-5)


def test_spg_masks_one_block_in_part_and_every_later_block():
    """SPG's block_random (min_t 0, max_t 1): a view picks a block the row's units reach, masks 1 to
    all of its unit columns, and every later column; columns past the units are masked."""
    p = make_policy(estimator="spg", gen_length=12, block_length=4, steps=6, spg_views=3)
    batch = p.rollout(PROMPTS, 3, seeds=[1, 2])
    inputs = inputs_of(batch, spg_views=3, block_length=4)
    for mask in spg_masks(inputs):
        for row, length in zip(mask, inputs.lengths.tolist()):
            first = int(row.nonzero()[0])
            b = first // 4
            assert b <= (length - 1) // 4  # a block the units reach
            assert row[4 * (b + 1):].all() and row[length:].all()
            assert row[4 * b:min(4 * b + 4, length)].sum() >= 1


def test_spg_bounds_follow_a_hand_computed_example():
    """One row of L = 3 units, two views: S_1 = {0, 1} (t_1 = 2/3), S_2 = {1, 2} (t_2 = 2/3);
    lower = mean_v mean_{S_v} log p; eubo = mean over units of log(mean_v 1[u in S_v] p^beta / t_v) / beta."""
    lp = torch.tensor([[[-1.0, -2.0, 0.0]], [[0.0, -0.5, -3.0]]])
    scored = torch.tensor([[[True, True, False]], [[False, True, True]]])
    beta = 1.5
    lower, upper = sandwich_bounds(lp, scored, torch.tensor([3]), beta, "eubo", 0.5)
    hand_lower = ((-1.0 - 2.0) / 2 + (-0.5 - 3.0) / 2) / 2
    t = 2 / 3
    a = [math.exp(beta * -1.0) / t / 2, (math.exp(beta * -2.0) + math.exp(beta * -0.5)) / t / 2,
         math.exp(beta * -3.0) / t / 2]
    hand_upper = sum(math.log(x) for x in a) / 3 / beta
    assert lower.sum().item() / 3 == pytest.approx(hand_lower, abs=1e-6)
    assert upper.sum().item() / 3 == pytest.approx(hand_upper, abs=1e-6)
    _, mix = sandwich_bounds(lp, scored, torch.tensor([3]), beta, "mix", 0.25)
    assert mix.sum().item() / 3 == pytest.approx(0.25 * hand_upper + 0.75 * hand_lower, abs=1e-6)


def test_sandwiched_loss_takes_the_lower_bound_where_rewarded():
    lower, upper = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]]), torch.tensor([[-0.5, -1.0], [-2.0, -1.5]])
    adv, mask = torch.tensor([0.5, -1.0]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    weights = mask / 3  # token_mean
    terms = sandwiched_loss(lower, upper, adv, mask, weights, AlgorithmConfig())
    hand = (-0.5 * (-1.0 - 2.0) + 1.0 * (-2.0)) / 3
    assert terms.loss.item() == pytest.approx(hand) and terms.units == 3.0


def test_espo_masks_complementary_pairs_at_stratified_counts():
    p = make_policy(estimator="espo", espo_samples=3)
    batch = p.rollout(PROMPTS, 2, seeds=[1, 2])
    views = LOGP_ESTIMATORS.get("espo")(inputs_of(batch, espo_samples=3))
    width = 8
    assert len(views) == 6
    counts = torch.stack([views[2 * m].masked.sum(1) for m in range(3)], 1)
    for m in range(3):
        assert torch.equal(views[2 * m].masked, ~views[2 * m + 1].masked)
        t = counts[:, m].double() / (width + 1)
        assert torch.allclose(views[2 * m].weight.double(), torch.where(t > 0, 1 / (6 * t), 0.0), rtol=1e-6)
        rest = width / (width + 1) - t  # 0 when all C columns are masked: the complement scores nothing
        assert torch.allclose(views[2 * m + 1].weight.double(), torch.where(rest > 1e-9, 1 / (6 * rest), 0.0),
                              rtol=1e-6)
    gaps = (counts[:, 1:] - counts[:, :-1]) % (width + 1)  # the three counts sit (C + 1) / 3 = 3 apart
    assert set(gaps.flatten().tolist()) <= {3}


def test_tracerl_scores_each_token_on_the_canvas_before_its_step():
    """Written out token by token: y_u scored with every token committed at its (merged) step or
    later masked; with shrink 1 at T = 1 that is the sampler's own log-prob."""
    p = make_policy(estimator="tracerl", trace_shrink=1, temperature=1.0)
    batch = p.rollout(PROMPTS, 2, seeds=[3, 4])
    ex = batch.extras
    with torch.no_grad():
        logp, _ = p.logprobs(p.model, batch)
        ref = torch.zeros_like(logp)
        for i in range(len(batch)):
            for u in range(8):
                masked = ex["completion_step"][i:i + 1] >= ex["completion_step"][i, u]
                row = {k: (v[i:i + 1] if torch.is_tensor(v) and v.dim() else v) for k, v in ex.items()}
                ref[i, u] = masked_logps(p, row, masked)[0, u]
    mask = batch.unit_mask.bool()
    assert torch.allclose(logp[mask], ref[mask], atol=1e-5)
    assert torch.allclose(logp[mask], batch.rollout_logp[mask], atol=1e-5)


def test_tracerl_merges_consecutive_steps():
    steps = torch.tensor([[0, 1, 2, 3, 4, 4], [5, 5, 2, 2, 9, 7]])
    assert collapse_steps(steps, 2).tolist() == [[1, 1, 3, 3, 4, 4], [5, 5, 5, 5, 9, 9]]
    assert torch.equal(collapse_steps(steps, 1), steps)


def test_agrpo_weights_are_unbiased_monte_carlo_weights():
    """Uniform: K stratified draws over last + 1 steps; a drawn step's units weigh (times drawn) /
    (K / (last + 1)); with K = last + 1 every step is drawn once (weight 1). Entropy: p(s) in
    proportion to the step's summed entropy; weight 1 / (K p(s))."""
    steps = torch.tensor([[0, 1, 2, 3, 3, 3]])
    inputs = EstimatorInputs([torch.Generator().manual_seed(0)], torch.ones(1, 2), 6, torch.tensor([5]),
                             EstimatorArgs(agrpo_samples=4), steps, torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.0, 0.0]]))
    assert agrpo_unit_weights(inputs).tolist() == [[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]]  # column 5 is past the units
    inputs.args = EstimatorArgs(agrpo_samples=2)
    w = agrpo_unit_weights(inputs)[0]
    drawn = [s for s in range(4) if w[steps[0] == s].sum() > 0]
    assert len(drawn) == 2 and drawn[0] in (0, 1) and drawn[1] in (2, 3)  # one per stratum
    assert all(w[steps[0] == s][0] == 2.0 for s in drawn)  # 1 / (2 * 1/4)
    inputs.args = EstimatorArgs(agrpo_samples=1, agrpo_step_sampling="entropy")
    w = agrpo_unit_weights(inputs)[0]
    p = torch.tensor([1.0, 2.0, 3.0, 4.0]) + 1e-8
    p = p / p.sum()
    s = int(steps[0][w > 0][0])
    assert w[w > 0][0].item() == pytest.approx(1 / p[s].item(), rel=1e-5)
    mean = torch.zeros(6)
    for seed in range(400):
        inputs.generators = [torch.Generator().manual_seed(seed)]
        mean += agrpo_unit_weights(inputs)[0] / 400
    assert torch.allclose(mean[:5], torch.ones(5), atol=0.25)  # unbiased: E[weight] = 1


def test_sequence_kl_spreads_the_rows_estimate_over_its_units():
    cfg = AlgorithmConfig(kl_estimator="k2", kl_level="sequence")
    logp, ref = torch.tensor([[-1.0, -2.0, -5.0]]), torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    added, _ = sequence_kl_term(TermInputs(logp, logp, torch.zeros(1, 1), mask, cfg, ref), 0.1)
    hand = 0.1 * 0.5 * ((-1.0 - 2.0) - (-1.5 - 1.0)) ** 2 / 2
    assert added[0, 0].item() == pytest.approx(hand) and added[0, 1].item() == pytest.approx(hand)


RECIPE = {
    "task": "dlm",
    "policy": {"model": "tiny:dlm-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2},
               "gen_length": 8, "block_length": 4, "steps": 4},
    "data": {"name": "arithmetic", "args": {"n_train": 32, "n_eval": 4, "digits": 1}},
    "rewards": {"digit_share": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "digit_reward.py")],
    "algorithm": {"group_size": 4}, "optim": {"lr": 1e-3, "prompts_per_step": 3, "micro_batch_size": 12},
    "logging": {"report_to": ["none"], "progress": False}, "max_steps": 1,
}


@pytest.mark.parametrize("overrides", [
    ["policy.estimator=spg", "algorithm.objective=spg", "algorithm.mu=2"],
    ["policy.estimator=espo", "algorithm.ratio_level=sequence", "algorithm.aggregation=seq_mean_token_mean",
     "algorithm.beta=0.01", "algorithm.kl_estimator=k2", "algorithm.kl_level=sequence"],
    ["policy.estimator=tracerl", "policy.trace_shrink=2"],
    ["policy.estimator=agrpo", "policy.agrpo_samples=2"],
])
def test_a_training_step(tmp_path, overrides):
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", *overrides]))
    assert on_policy_step_changes(t, rollout_atol=None)


def test_agrpo_trains_only_the_drawn_steps_with_their_weights(tmp_path):
    """The step's loss is sum_u w_u c_u (-A_i) at ratio 1: w the aggregation's weights, c the units'
    Monte Carlo weights (0 for the steps not drawn)."""
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", "policy.estimator=agrpo", "policy.agrpo_samples=1"]))
    batch = t.prepare_batch(1)
    view = t.policy.pass_view(batch.rollout, 0)
    c = t.policy.unit_weights(view)
    assert ((c == 0) & (batch.rollout.unit_mask > 0)).any()  # one step of four drawn per row: some units left out
    hand = (batch.weights * c * -batch.advantages[:, None] * batch.rollout.unit_mask * batch.row_mask[:, None]).sum()
    metrics = t.updater.update(batch)
    assert metrics["loss"] == pytest.approx(hand.item(), rel=1e-5)


def test_spg_refuses_a_kl_term_and_log_prob_objectives(tmp_path):
    from mmrl.config.parse import ConfigError
    from mmrl.train.plan.validate import validate
    bad = parse_config(RECIPE, [f"output_dir={tmp_path}", "policy.estimator=spg", "algorithm.objective=spg",
                                "algorithm.beta=0.01"])
    with pytest.raises(ConfigError, match="algorithm.beta=0.01: objective 'spg' trains on likelihood bounds"):
        validate(bad, 1)
    clip = parse_config(RECIPE, [f"output_dir={tmp_path}", "policy.estimator=spg"])
    with pytest.raises(ConfigError, match="algorithm.objective='clip' takes logprobs from the policy"):
        validate(clip, 1)
