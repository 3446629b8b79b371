"""On-policy distillation's signal (mmrl/core/distillation.py): the divergences against hand-written
sums and TRL's GKD loss, a teacher equal to the student giving zero signal, and the policy gradient
of the distilled advantage against a hand-written one."""

import math

import pytest
import torch

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.core.distillation import distilled_advantages, generalized_jsd, sampled_reverse_kl
from mmrl.core.objectives import policy_loss, token_mean


def hand_jsd(s_logits, t_logits, beta, temperature=1.0):
    """Eq. 1 of GKD, one unit at a time, with python floats (TRL's beta 0 / 1 cases)."""
    out = torch.zeros(s_logits.shape[:-1], dtype=torch.float64)
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in s_logits.shape[:-1]]):
        zs, zt = s_logits[tuple(idx)].double() / temperature, t_logits[tuple(idx)].double() / temperature
        ps = [math.exp(v) / sum(math.exp(w) for w in zs.tolist()) for v in zs.tolist()]
        pt = [math.exp(v) / sum(math.exp(w) for w in zt.tolist()) for v in zt.tolist()]

        def kl(p, q):
            return sum(a * math.log(a / b) for a, b in zip(p, q))
        if beta == 0:
            value = kl(pt, ps)
        elif beta == 1:
            value = kl(ps, pt)
        else:
            m = [(1 - beta) * a + beta * b for a, b in zip(ps, pt)]
            value = beta * kl(pt, m) + (1 - beta) * kl(ps, m)
        out[tuple(idx)] = value
    return out


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_generalized_jsd_matches_the_hand_written_sum(beta):
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 3, 7, generator=g) * 2, torch.randn(2, 3, 7, generator=g) * 2
    for temperature in (1.0, 1.7):
        ours = generalized_jsd(s, t, beta, temperature)
        assert ours.shape == (2, 3)
        assert torch.allclose(ours.double(), hand_jsd(s, t, beta, temperature), atol=1e-5)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_generalized_jsd_matches_trl_gkd(beta):
    """TRL's GKDTrainer.generalized_jsd_loss on the same logits and padding: its masked sum and batchmean."""
    gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
    g = torch.Generator().manual_seed(1)
    s, t = torch.randn(3, 5, 11, generator=g) * 3, torch.randn(3, 5, 11, generator=g) * 3
    labels = torch.randint(0, 11, (3, 5), generator=g)
    labels[0, 3:] = -100
    labels[2, 1:] = -100
    mask = (labels != -100).float()
    for temperature in (1.0, 0.6):
        ours = generalized_jsd(s, t, beta, temperature)
        theirs_sum = gkd.GKDTrainer.generalized_jsd_loss(s, t, labels, beta, temperature, reduction="sum")
        theirs_mean = gkd.GKDTrainer.generalized_jsd_loss(s, t, labels, beta, temperature)
        assert torch.allclose((ours * mask).sum(), theirs_sum, rtol=1e-5, atol=1e-6)
        assert torch.allclose((ours * mask).sum() / mask.sum(), theirs_mean, rtol=1e-5, atol=1e-6)


def test_a_teacher_equal_to_the_student_gives_zero_signal():
    g = torch.Generator().manual_seed(2)
    logits, logp = torch.randn(4, 6, 9, generator=g), torch.randn(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) > 0.3).float()
    for beta in (0.0, 0.5, 1.0):
        assert generalized_jsd(logits, logits.clone(), beta).abs().max() < 1e-6
    signal = sampled_reverse_kl(logp, logp.clone())
    assert signal.abs().max() == 0
    rewards_adv = torch.randn(4, generator=g)
    combined = distilled_advantages(rewards_adv, signal, mask, weight=0.7)
    assert torch.equal(combined, rewards_adv[:, None] * mask)
    assert distilled_advantages(None, signal, mask, weight=0.7).abs().max() == 0


def test_distilled_advantages_by_hand():
    adv = torch.tensor([1.0, -0.5])
    d = torch.tensor([[0.2, -0.4, 1.0], [0.0, 0.3, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    want = torch.tensor([[1.0 - 0.5 * 0.2, 1.0 + 0.5 * 0.4, 0.0], [-0.5, -0.5 - 0.15, -0.5 - 0.25]])
    assert torch.allclose(distilled_advantages(adv, d, mask, 0.5), want)
    assert torch.allclose(distilled_advantages(None, d, mask, 2.0), -2.0 * d * mask)
    per_unit = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert torch.allclose(distilled_advantages(per_unit, d, mask, 1.0), per_unit * mask - d * mask)


def test_gradient_of_the_distilled_objective_against_a_hand_written_policy_gradient():
    """On policy (ratio 1, nothing clipped) the clip surrogate with A_iu = A_i - w (log s - log t) has the
    gradient -sum_iu w_iu A_iu (onehot(a_iu) - softmax(z_iu)) in the student's logits z, the divergence
    being a detached signal (the reverse-KL policy gradient of on-policy distillation)."""
    g = torch.Generator().manual_seed(3)
    B, U, V = 3, 4, 5
    z = torch.randn(B, U, V, generator=g, requires_grad=True)
    teacher = torch.randn(B, U, V, generator=g)
    actions = torch.randint(0, V, (B, U), generator=g)
    mask = torch.ones(B, U)
    mask[1, 3] = 0
    adv = torch.tensor([0.5, -1.0, 0.0])
    logp = torch.log_softmax(z, -1).gather(-1, actions[..., None])[..., 0]
    t_logp = torch.log_softmax(teacher, -1).gather(-1, actions[..., None])[..., 0]
    weight = 0.8
    a_iu = distilled_advantages(adv, sampled_reverse_kl(logp.detach(), t_logp), mask, weight)
    w = token_mean(mask, float(mask.sum()), B, U)
    loss = policy_loss(logp, logp.detach(), a_iu, mask, w, AlgorithmConfig()).loss
    loss.backward()
    p = torch.softmax(z.detach(), -1)
    onehot = torch.nn.functional.one_hot(actions, V).float()
    a_hand = torch.zeros(B, U)
    for i in range(B):
        for u in range(U):
            d = float(logp[i, u].detach() - t_logp[i, u])
            a_hand[i, u] = (float(adv[i]) - weight * d) * float(mask[i, u])
    want = -(w * a_hand)[..., None] * (onehot - p)
    assert torch.allclose(z.grad, want, atol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_gradient_of_the_distillation_loss_against_hand_written_kl_gradients(beta):
    """form loss: the surrogate plus w JSD_beta differentiated through the student's logits z; at beta 1
    d/dz KL(S || T) = p (log p - log t - KL), at beta 0 d/dz KL(T || S) = p - t, by hand."""
    g = torch.Generator().manual_seed(4)
    B, U, V = 2, 3, 6
    z = torch.randn(B, U, V, generator=g, requires_grad=True)
    teacher = torch.randn(B, U, V, generator=g)
    actions = torch.randint(0, V, (B, U), generator=g)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    logp = torch.log_softmax(z, -1).gather(-1, actions[..., None])[..., 0]
    cfg = AlgorithmConfig()
    cfg.distill.teacher, cfg.distill.form, cfg.distill.weight = {"model": "t"}, "loss", 0.3
    w = token_mean(mask, float(mask.sum()), B, U)
    terms = policy_loss(logp, logp.detach(), torch.zeros(B), mask, w, cfg, distill=generalized_jsd(z, teacher, beta))
    terms.loss.backward()
    p, t = torch.softmax(z.detach(), -1), torch.softmax(teacher, -1)
    if beta == 1.0:
        kl = (p * (p.log() - t.log())).sum(-1, keepdim=True)
        hand = p * (p.log() - t.log() - kl)
    else:
        hand = p - t
    assert torch.allclose(z.grad, 0.3 * (w * mask)[..., None] * hand, atol=1e-6)
    want_sum = float((generalized_jsd(z.detach(), teacher, beta) * mask).sum())
    assert terms.metrics["distill"] == pytest.approx(want_sum, rel=1e-5)
