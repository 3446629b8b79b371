"""The clipped surrogate, KL estimators, ratio levels and aggregations against hand-written
references (plain Python loops over small numbers)."""

import math

import pytest
import torch

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.core.objectives import AGGREGATIONS, grouped_log_ratio, policy_loss, ratio_segments, weighted_likelihood_loss
from mmrl.core.regularisers import KL_ESTIMATORS, REGULARISERS, Regulariser, closed_form_kl, reference_pass, regulariser_needs

LOGP = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]]
OLD = [[-1.1, -1.5, -0.5], [-0.9, -1.2, -2.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
ADV = [1.5, -2.0]


def reference_loss(logp, old, adv, mask, eps_low, eps_high, level="unit", chunks=None, dual=None,
                   weights=None):
    n_units = sum(sum(r) for r in mask)
    total = 0.0
    for i in range(len(logp)):
        lr = [a - b for a, b in zip(logp[i], old[i])]
        if level == "sequence":
            valid = [lr[u] for u in range(3) if mask[i][u]]
            lr = [sum(valid) / len(valid)] * 3
        elif level == "chunk":
            out, start = [], 0
            for size in chunks:
                valid = [lr[u] for u in range(start, start + size) if mask[i][u]]
                mean = sum(valid) / len(valid) if valid else 0.0
                out += [mean] * size
                start += size
            lr = out
        for u in range(3):
            if not mask[i][u]:
                continue
            r = math.exp(lr[u])
            a = adv[i]
            pg = max(-a * r, -a * min(max(r, 1 - eps_low), 1 + eps_high))
            if dual is not None and a < 0:
                pg = min(pg, -dual * a)
            w = weights[i][u] if weights else 1.0 / n_units
            total += w * pg
    return total


def run(cfg, weights=None, **kw):
    logp = torch.tensor(LOGP, requires_grad=True)
    mask = torch.tensor(MASK)
    w = AGGREGATIONS.get("token_mean")(mask, mask.sum(), 2, 3) if weights is None else torch.tensor(weights)
    return policy_loss(logp, torch.tensor(OLD), torch.tensor(ADV), mask, w, cfg, **kw)


@pytest.mark.parametrize("eps_low,eps_high", [(0.2, 0.2), (0.2, 0.28), (0.05, 0.5)])
def test_unit_clip_matches_reference(eps_low, eps_high):
    cfg = AlgorithmConfig(eps_low=eps_low, eps_high=eps_high)
    got = run(cfg).loss.item()
    assert got == pytest.approx(reference_loss(LOGP, OLD, ADV, MASK, eps_low, eps_high), abs=1e-6)


def test_sequence_level_gspo():
    cfg = AlgorithmConfig(ratio_level="sequence", eps_low=3e-4, eps_high=4e-4)
    got = run(cfg).loss.item()
    assert got == pytest.approx(reference_loss(LOGP, OLD, ADV, MASK, 3e-4, 4e-4, level="sequence"), abs=1e-6)


def test_chunk_level():
    cfg = AlgorithmConfig(ratio_level="chunk", chunks=[1, 2])
    segs = ratio_segments("chunk", 3, [1, 2])
    got = run(cfg, segments=segs).loss.item()
    assert got == pytest.approx(reference_loss(LOGP, OLD, ADV, MASK, 0.2, 0.2, level="chunk", chunks=[1, 2]),
                                abs=1e-6)


def test_chunk_sizes_must_cover_units():
    with pytest.raises(ValueError, match="chunks"):
        ratio_segments("chunk", 3, [1, 1])
    with pytest.raises(ValueError, match="needs algorithm.chunks"):
        ratio_segments("chunk", 3, None)


def test_dual_clip():
    cfg = AlgorithmConfig(eps_low=0.2, eps_high=0.2, dual_clip=1.1)
    # a large ratio on the negative-advantage row makes the dual clip bind
    logp = [[-1.0, -2.0, -0.5], [0.5, -1.2, -2.2]]
    t = policy_loss(torch.tensor(logp), torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK),
                    torch.tensor(MASK) / 5, cfg)
    assert t.loss.item() == pytest.approx(reference_loss(logp, OLD, ADV, MASK, 0.2, 0.2, dual=1.1), abs=1e-6)
    no_dual = reference_loss(logp, OLD, ADV, MASK, 0.2, 0.2)
    assert t.loss.item() < no_dual


def test_kl_estimators():
    logp, ref = torch.tensor([-1.0, -0.2]), torch.tensor([-1.5, 0.1])
    x = [-1.5 - -1.0, 0.1 - -0.2]
    assert KL_ESTIMATORS.get("k1")(logp, ref).tolist() == pytest.approx([-v for v in x])
    assert KL_ESTIMATORS.get("k2")(logp, ref).tolist() == pytest.approx([v * v / 2 for v in x])
    assert KL_ESTIMATORS.get("k3")(logp, ref).tolist() == pytest.approx([math.exp(v) - v - 1 for v in x])


def test_kl_term_added_with_beta():
    ref = torch.tensor([[-1.2, -1.9, -0.7], [-0.4, -1.0, -2.0]])
    cfg = AlgorithmConfig(beta=0.04, kl_estimator="k3")
    got = run(cfg, ref_logp=ref)
    base = reference_loss(LOGP, OLD, ADV, MASK, 0.2, 0.2)
    kl = sum(math.exp(ref[i][u].item() - LOGP[i][u]) - (ref[i][u].item() - LOGP[i][u]) - 1
             for i in range(2) for u in range(3) if MASK[i][u])
    assert got.loss.item() == pytest.approx(base + 0.04 * kl / 5, abs=1e-6)
    assert got.metrics["kl"] == pytest.approx(kl, abs=1e-5)
    with pytest.raises(ValueError, match="reference"):
        run(cfg)


def test_entropy_bonus_and_llds():
    ent = torch.tensor([[0.5, 1.0, 2.0], [1.5, 0.1, 9.0]])
    cfg = AlgorithmConfig(entropy_coef=0.01)
    got = run(cfg, entropy=ent).loss.item()
    base = reference_loss(LOGP, OLD, ADV, MASK, 0.2, 0.2)
    assert got == pytest.approx(base - 0.01 * (0.5 + 1.0 + 2.0 + 1.5 + 0.1) / 5, abs=1e-6)
    # LLDS: row 0's sequence log-lik change is -0.1 - 0.5 + 0 = -0.4 < 0 -> active on the unit
    # whose log-prob fell (u=1: old -1.5, new -2.0, penalty 0.5); row 1 rose (+0.6) -> inactive.
    cfg = AlgorithmConfig(llds_coef=0.5)
    terms = run(cfg)
    assert terms.loss.item() == pytest.approx(base + 0.5 * 0.5 / 5, abs=1e-6)
    assert terms.metrics["llds_active"] == 1


def reference_llds(logp, old, adv, mask, rows):
    """LLDS as the authors' actor does it (response-level gate), in plain Python: preserving units
    are those with advantage >= 0 (rows="non_negative") or all; a row is active when the summed
    drop old - new over its preserving units is > 0; the penalty is max(0, old - new) on its
    preserving units; token mean over every valid unit of the batch."""
    total, units = 0.0, sum(sum(r) for r in mask)
    for i in range(len(logp)):
        a = adv[i] if isinstance(adv[i], list) else [adv[i]] * len(logp[i])
        keep = [mask[i][u] and (rows == "all" or a[u] >= 0) for u in range(len(logp[i]))]
        if sum(old[i][u] - logp[i][u] for u in range(len(keep)) if keep[u]) > 0:
            total += sum(max(0.0, old[i][u] - logp[i][u]) for u in range(len(keep)) if keep[u])
    return total / units


@pytest.mark.parametrize("rows", ["non_negative", "all"])
def test_llds_follows_the_authors_preserving_set(rows):
    # the case: one token, A = -1, log-prob down by 0.5, coefficient 0.2: the authors add 0
    # (a negative-advantage row is not preserved), the "all" option 0.2 * 0.5 = 0.1
    cfg = AlgorithmConfig(llds_coef=0.2, llds_rows=rows, eps_low=10.0, eps_high=10.0)
    one = policy_loss(torch.tensor([[-1.5]]), torch.tensor([[-1.0]]), torch.tensor([-1.0]), torch.ones(1, 1),
                      torch.ones(1, 1), cfg)
    assert one.loss.item() - math.exp(-0.5) == pytest.approx({"non_negative": 0.0, "all": 0.1}[rows], abs=1e-6)
    # step-level advantages with mixed signs: only the units with A >= 0 gate and take the penalty
    logp = [[-1.0, -2.0, -0.5, -0.2], [-0.3, -1.9, -2.2, -0.1]]
    old = [[-1.1, -1.5, -0.8, -0.2], [-0.9, -1.2, -2.0, -0.4]]
    adv = [[1.0, 0.5, -1.0, 0.0], [-0.5, -1.0, 2.0, 0.3]]
    mask = [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]]
    m = torch.tensor(mask)
    w = AGGREGATIONS.get("token_mean")(m, m.sum(), 2, 4)
    with_llds = policy_loss(torch.tensor(logp), torch.tensor(old), torch.tensor(adv), m, w,
                            AlgorithmConfig(llds_coef=0.3, llds_rows=rows))
    without = policy_loss(torch.tensor(logp), torch.tensor(old), torch.tensor(adv), m, w, AlgorithmConfig())
    expected = 0.3 * reference_llds(logp, old, adv, mask, rows)
    assert expected > 0
    assert with_llds.loss.item() - without.loss.item() == pytest.approx(expected, abs=1e-6)
    # non_negative: row 0 drops -0.1 + 0.5 + 0 on its A >= 0 units (active), row 1's A >= 0 unit
    # (u = 2) drops 0.2 (active); all: row 0 drops -0.1 + 0.5 - 0.3 + 0 > 0, row 1 -0.6 + 0.7 + 0.2 > 0
    assert with_llds.metrics["llds_active"] == 2
    with pytest.raises(ValueError, match="algorithm.llds_rows"):
        policy_loss(torch.tensor(logp), torch.tensor(old), torch.tensor(adv), m, w,
                    AlgorithmConfig(llds_coef=0.3, llds_rows="some"))


def test_aggregations_by_hand():
    mask = torch.tensor(MASK)
    tm = AGGREGATIONS.get("token_mean")(mask, 5.0, 2.0, 3)
    assert tm.flatten().tolist() == pytest.approx([0.2] * 3 + [0.2, 0.2, 0.0])
    sm = AGGREGATIONS.get("seq_mean_token_mean")(mask, 5.0, 2.0, 3)
    assert sm.flatten().tolist() == pytest.approx([1 / 6] * 3 + [0.25, 0.25, 0.0])
    dr = AGGREGATIONS.get("seq_mean_token_sum_norm")(mask, 5.0, 2.0, 4)
    assert dr.flatten().tolist() == pytest.approx([1 / 8] * 3 + [1 / 8, 1 / 8, 0.0])


def test_on_policy_ratio_is_one_and_gradient_is_advantage_weighted():
    cfg = AlgorithmConfig()
    logp = torch.tensor(LOGP, requires_grad=True)
    mask = torch.tensor(MASK)
    w = mask / mask.sum()
    t = policy_loss(logp, logp.detach(), torch.tensor(ADV), mask, w, cfg)
    assert t.ratio_max_dev == 0.0 and t.clipped == 0
    t.loss.backward()
    expected = [-ADV[i] * w[i][u].item() for i in range(2) for u in range(3)]
    assert logp.grad.flatten().tolist() == pytest.approx(expected)


def test_clip_fraction_counts_clipped_units():
    cfg = AlgorithmConfig(eps_low=0.2, eps_high=0.2)
    # by hand: row 0 (A > 0) ratios e^.4 = 1.49 (binds: > 1.2), e^-.5, 1; row 1 (A < 0) ratios
    # e^.6 = 1.82 (the pessimistic unclipped term wins: not clipped), 1 -> one clipped unit of 5
    logp = [[-0.7, -2.0, -0.5], [-0.3, -1.2, -2.2]]
    t = policy_loss(torch.tensor(logp), torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK),
                    torch.tensor(MASK) / 5, cfg)
    assert t.clipped == 1


def test_grouped_log_ratio_masks_padding():
    lr = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert grouped_log_ratio(lr, mask, "sequence", None)[0, 0].item() == pytest.approx(2.0)


def test_wd1_weighted_likelihood_matches_reference():
    """wd1: -sum_i softmax_g(A)_i log L_i + sum_i softmax_g(-A)_i log L_i, softmax per group."""
    from mmrl.core.objectives import OBJECTIVES, wd1_coefficients
    adv = torch.tensor([1.0, -0.5, -0.5, 2.0, 0.0, -2.0])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    row_mask = torch.tensor([True, True, True, True, True, False])
    logp = torch.tensor([[-1.0, -0.5], [-2.0, -0.1], [-0.3, -0.2], [-1.5, -0.7], [-0.2, -0.9], [-3.0, -1.0]],
                        requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    groups = [([0, 1, 2], [1.0, -0.5, -0.5]), ([3, 4], [2.0, 0.0])]  # row 5 takes no part
    expected = 0.0
    for rows, a in groups:
        pos = [math.exp(x) / sum(math.exp(y) for y in a) for x in a]
        neg = [math.exp(-x) / sum(math.exp(-y) for y in a) for x in a]
        for i, p, q in zip(rows, pos, neg):
            log_lik = sum(logp[i, u].item() * mask[i, u].item() for u in range(2))
            expected += -p * log_lik + q * log_lik
    coef = wd1_coefficients(adv, group, row_mask)
    assert coef[5] == 0
    objective = OBJECTIVES.get("wd1")
    assert objective.row_coefficients is wd1_coefficients and not objective.uses_ratio
    terms = objective.loss(logp, logp.detach(), coef, mask * row_mask[:, None], torch.ones(6, 2),
                           AlgorithmConfig())
    assert terms.loss.item() == pytest.approx(expected, abs=1e-6)
    assert terms.ratio_max_dev == 0.0
    # a group with equal rewards pushes nothing
    assert torch.equal(wd1_coefficients(torch.zeros(3), torch.zeros(3, dtype=torch.long),
                                        torch.ones(3, dtype=torch.bool)), torch.zeros(3))


def test_regularisers_declare_their_needs():
    assert not any(regulariser_needs(AlgorithmConfig(), n) for n in ("all_rows", "whole_rows", "reference", "entropy"))
    kl = AlgorithmConfig(beta=0.04)
    assert regulariser_needs(kl, "all_rows") and reference_pass(kl) and not regulariser_needs(kl, "whole_rows")
    closed = AlgorithmConfig(beta=0.04, kl_estimator="closed_form")
    assert closed_form_kl(closed) and not reference_pass(closed)
    assert not closed_form_kl(AlgorithmConfig(kl_estimator="closed_form"))  # beta 0: no KL at all
    assert regulariser_needs(AlgorithmConfig(entropy_coef=0.1), "entropy")
    assert regulariser_needs(AlgorithmConfig(llds_coef=0.1), "whole_rows")
    assert not reference_pass(AlgorithmConfig(llds_coef=0.1, entropy_coef=0.1))


def test_a_registered_regulariser_joins_the_loss_with_its_metric():
    """A new term is one registration: it is added to the surrogate and reports its own sums."""
    def squared_logp(x, coef):
        penalty = x.logp ** 2
        return coef * penalty, {"sq": float((penalty.detach() * x.mask).sum())}

    cfg = AlgorithmConfig()
    base = run(cfg).loss.item()
    REGULARISERS.register("test_sq")(Regulariser(lambda c: 0.1, squared_logp, {"sq": ("sq", True)}, all_rows=True))
    try:
        assert regulariser_needs(cfg, "all_rows")
        got = run(cfg)
        sq = sum(LOGP[i][u] ** 2 for i in range(2) for u in range(3) if MASK[i][u])
        assert got.loss.item() == pytest.approx(base + 0.1 * sq / 5, abs=1e-6)
        assert got.metrics["sq"] == pytest.approx(sq, abs=1e-5)
        assert got.metrics["kl"] == 0.0 and got.metrics["llds_active"] == 0.0
    finally:
        del REGULARISERS._items["test_sq"]


def test_ratio_free_objective_skips_old_policy_terms():
    """LLDS compares with the old policy: wd1 (no ratio) leaves it out, as before the registry."""
    logp, mask = torch.tensor(LOGP), torch.tensor(MASK)
    w = AGGREGATIONS.get("token_mean")(mask, mask.sum(), 2, 3)
    coef = torch.tensor([0.3, -0.3])
    plain = weighted_likelihood_loss(logp, torch.tensor(OLD), coef, mask, w, AlgorithmConfig())
    llds = weighted_likelihood_loss(logp, torch.tensor(OLD), coef, mask, w, AlgorithmConfig(llds_coef=0.5))
    assert llds.loss.item() == plain.loss.item() and llds.metrics["llds_active"] == 0.0


def _nft_unit_losses_by_hand(v, v_old, xt, x0, t, beta):
    """DiffusionNFT's L(v+) and L(v-) of one row, element by element in Python floats."""
    out = []
    positive = [beta * a + (1 - beta) * b for a, b in zip(v, v_old)]
    negative = [(1 + beta) * b - beta * a for a, b in zip(v, v_old)]
    for u in (positive, negative):
        diffs = [a - t * b - c for a, b, c in zip(xt, u, x0)]
        weight = max(sum(abs(d) for d in diffs) / len(diffs), 1e-5)
        out.append(sum(d * d for d in diffs) / len(diffs) / weight)
    return out


def test_nft_implicit_velocity_losses_match_a_hand_computation():
    """L+ and L- of DiffusionNFT's implicit positive / negative velocities, with the adaptive
    weight mean|x0_pred - x0| (detached), on rows of different noise levels."""
    from mmrl.tasks.diffusion.forward_process import implicit_velocity_losses, renoised
    g = torch.Generator().manual_seed(0)
    x0, eps, v, v_old = (torch.randn(3, 2, 2, 2, generator=g) for _ in range(4))
    t = torch.tensor([0.9, 0.5, 0.1])
    xt = renoised(x0, eps, t)
    for i in range(3):
        assert torch.allclose(xt[i], (1 - t[i]) * x0[i] + t[i] * eps[i])
    pos, neg = implicit_velocity_losses(v, v_old, xt, x0, t, beta=0.3)
    for i in range(3):
        expected = _nft_unit_losses_by_hand(v[i].flatten().tolist(), v_old[i].flatten().tolist(),
                                            xt[i].flatten().tolist(), x0[i].flatten().tolist(), float(t[i]), 0.3)
        assert math.isclose(pos[i].item(), expected[0], rel_tol=1e-5)
        assert math.isclose(neg[i].item(), expected[1], rel_tol=1e-5)


def test_nft_objective_weighs_positive_and_negative_losses_by_the_normalised_reward():
    """loss = sum_u w_u c (r L+ + (1 - r) L-) / beta_nft + beta KL, r = clip(A, -c, c) / (2c) + 1/2; and
    with the old velocity the policy's own (one pass), its gradient in v is c (2r - 1) dL/dv with the
    adaptive weight held fixed: -2 t c (2r - 1) (x_t - t v - x0) / (D w)."""
    from mmrl.core.objectives import OBJECTIVES, nft_reward_weight
    from mmrl.tasks.diffusion.forward_process import implicit_velocity_losses
    cfg = AlgorithmConfig(objective="nft", nft_beta=0.5, nft_adv_clip=2.0, beta=0.1, kl_estimator="closed_form")
    adv = torch.tensor([3.0, -1.0, 0.5])
    assert nft_reward_weight(adv, 2.0).tolist() == [1.0, 0.25, 0.625]
    positive = torch.tensor([[1.0, 2.0], [0.5, 0.25], [4.0, 1.0]])
    negative = torch.tensor([[3.0, 1.0], [2.0, 0.5], [1.0, 2.0]])
    kl = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    weights = mask / 5
    objective = OBJECTIVES.get("nft")
    assert objective.unit_terms == "implicit_velocity" and not objective.uses_ratio
    terms = objective.loss(positive, negative, adv, mask, weights, cfg, kl=kl)
    expected = 0.0
    for i, r in enumerate([1.0, 0.25, 0.625]):
        for u in range(2):
            if mask[i, u]:
                expected += (2.0 * (r * positive[i, u] + (1 - r) * negative[i, u]) / 0.5 + 0.1 * kl[i, u]) / 5
    assert math.isclose(terms.loss.item(), float(expected), rel_tol=1e-6)
    assert terms.units == 5 and terms.metrics["kl"] == pytest.approx(0.1 + 0.2 + 0.3 + 0.5 + 0.6)
    # the gradient with v_old = v (detached), one row at t = 0.4
    g = torch.Generator().manual_seed(1)
    x0, xt = torch.randn(1, 6, generator=g), torch.randn(1, 6, generator=g)
    v = torch.randn(1, 6, generator=g, requires_grad=True)
    t = torch.tensor([0.4])
    pos, neg = implicit_velocity_losses(v, v.detach(), xt, x0, t, beta=0.5)
    objective.loss(pos[:, None], neg[:, None], torch.tensor([-1.0]), torch.ones(1, 1), torch.ones(1, 1),
                   AlgorithmConfig(objective="nft", nft_beta=0.5, nft_adv_clip=2.0)).loss.backward()
    diff = (xt - 0.4 * v - x0).detach()
    w = diff.abs().mean()
    assert torch.allclose(v.grad, -2 * 0.4 * 2.0 * (2 * 0.25 - 1) * diff / (6 * w), atol=1e-6)


def test_grpo_guard_scales_the_log_ratio_and_each_steps_loss():
    """ratio_norm grpo_guard: rho = exp(s (logp - old)), loss_u = max(-A rho, -A clip(rho)) / |dt|, by hand,
    and its gradient in logp: -A s rho / |dt| inside the clip range, 0 outside."""
    cfg = AlgorithmConfig(eps_low=0.1, eps_high=0.1, ratio_norm="grpo_guard")
    logp = torch.tensor([[1.5, -1.0], [2.0, 0.3]], requires_grad=True)
    old = torch.tensor([[0.0, -0.5], [0.0, 0.3]])
    adv = torch.tensor([1.5, -2.0])
    scale = torch.tensor([[0.1, 0.2], [0.1, 0.2]])
    inv_dt = torch.tensor([[4.0, 8.0], [4.0, 8.0]])
    mask = torch.ones(2, 2)
    terms = policy_loss(logp, old, adv, mask, mask / 4, cfg, step_scales=(scale, inv_dt))
    expected, grads = 0.0, []
    for i in range(2):
        for u in range(2):
            rho = math.exp(scale[i, u].item() * (logp[i, u].item() - old[i, u].item()))
            a = adv[i].item()
            unclipped, clipped = -a * rho, -a * min(max(rho, 0.9), 1.1)
            expected += max(unclipped, clipped) * inv_dt[i, u].item() / 4
            grads.append(-a * scale[i, u].item() * rho * inv_dt[i, u].item() / 4 if unclipped >= clipped else 0.0)
    assert math.isclose(terms.loss.item(), expected, rel_tol=1e-6)
    terms.loss.backward()
    assert torch.allclose(logp.grad.flatten(), torch.tensor(grads), atol=1e-7)
    assert terms.clipped == 1  # row 0, step 0: rho = exp(0.15) > 1.1 with A > 0 (row 1's exp(0.2), A < 0, is not)
