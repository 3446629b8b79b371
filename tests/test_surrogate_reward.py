"""TDM-R1's surrogate reward (mmrl/core/surrogate_reward.py) against hand-written references: the
group preference loss and its gradient written number by number, the trust-region and runaway stops,
the revised-target loss's gradient by hand (squared and pseudo-Huber), and the cases whose signal
must be zero (a surrogate equal to the reference gives the student nothing; zero advantages give
the surrogate no preference gradient)."""

import math

import torch

from mmrl.core.surrogate_reward import (
    boundary_weight,
    denoising_errors,
    group_logits,
    group_preference_loss,
    guidance_direction,
    revised_target_loss,
    runaway_stop,
    surrogate_coefficients,
    student_reward_loss,
    surrogate_loss,
    trust_region_stop,
)

SETTINGS = {"beta": 1.0, "reference_beta": 0.001, "threshold": 0.05, "clip": 1e-3}


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def test_denoising_errors_are_the_row_mean_of_the_squared_velocity_error():
    target, v = torch.tensor([[1.0, 2.0], [0.0, -1.0]]), torch.tensor([[0.0, 0.0], [3.0, -1.0]])
    assert torch.allclose(denoising_errors(target, v), torch.tensor([(1 + 4) / 2, 9 / 2]))


def test_the_group_preference_loss_and_its_gradient_by_hand():
    """Two groups of two rows: l_g = sum A beta (e - e_ref) / G, loss = mean sigmoid(l_g) A e."""
    e = torch.tensor([0.5, 0.8, 0.3, 0.9], requires_grad=True)
    e_ref = torch.tensor([0.6, 0.7, 0.4, 0.4])
    a = torch.tensor([1.0, -1.0, 2.0, -0.5])
    group = torch.tensor([0, 0, 1, 1])
    beta = 2.0
    l0 = (1.0 * beta * (0.5 - 0.6) + -1.0 * beta * (0.8 - 0.7)) / 2
    l1 = (2.0 * beta * (0.3 - 0.4) + -0.5 * beta * (0.9 - 0.4)) / 2
    w = [_sigmoid(l0), _sigmoid(l0), _sigmoid(l1), _sigmoid(l1)]
    e_values = e.detach().tolist()
    assert torch.allclose(group_logits(e, e_ref, a, group, 2, beta), torch.tensor([l0, l0, l1, l1]))
    want = sum(w[i] * float(a[i]) * e_values[i] for i in range(4)) / 4
    loss = group_preference_loss(e, e_ref, a, group, 2, beta)
    assert abs(loss.item() - want) < 1e-6
    loss.backward()
    assert torch.allclose(e.grad, torch.tensor([w[i] * float(a[i]) / 4 for i in range(4)]), atol=1e-7)


def test_the_trust_region_stops_rows_that_moved_past_it_in_their_advantage_direction():
    e = torch.tensor([0.5, 0.5, 0.5, 0.5], requires_grad=True)
    slow = torch.tensor([0.6, 0.5, 0.4, 0.5])  # ratio exp(slow - e): 1.105, 1, 0.905, 1
    a = torch.tensor([1.0, 1.0, -1.0, -1.0])
    kept = trust_region_stop(e, slow, a, 0.01)
    kept.sum().backward()
    assert e.grad.tolist() == [0.0, 1.0, 0.0, 1.0]
    e.grad = None
    trust_region_stop(e, slow, a, 0.0).sum().backward()
    assert e.grad.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_the_runaway_stop_detaches_rows_far_past_the_reference_in_their_direction():
    e = torch.tensor([0.1, 0.1, 0.9, 0.45], requires_grad=True)
    e_ref = torch.tensor([0.5, 0.5, 0.5, 0.5])
    a = torch.tensor([1.0, -1.0, -1.0, -1.0])
    # row 0: lower for A > 0 and (0.4)^2 > 0.05: stopped; row 1: moved against its direction: kept;
    # row 2: higher for A <= 0, 0.16 > 0.05: stopped; row 3: moved the wrong way, kept.
    runaway_stop(e, e_ref, a, 0.05).sum().backward()
    assert e.grad.tolist() == [0.0, 1.0, 0.0, 1.0]


def test_the_surrogate_loss_adds_the_reference_anchor_and_zero_advantages_leave_only_it():
    torch.manual_seed(0)
    e = (torch.rand(6) * 0.1 + 0.5).requires_grad_(True)
    e_ref = e.detach() + 0.01 * torch.randn(6)
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    zero = torch.zeros(6)
    surrogate_loss(e, e_ref, None, zero, group, 3, SETTINGS).backward()
    assert torch.allclose(e.grad, 2 * 0.001 * (e.detach() - e_ref) / 6, atol=1e-9)
    e.grad = None
    surrogate_loss(e, e.detach().clone(), e.detach().clone(), zero, group, 3, SETTINGS).backward()
    assert e.grad.abs().max() == 0


def test_the_surrogate_loss_gradient_by_hand_with_both_stops_inactive():
    e = torch.tensor([0.50, 0.52, 0.49, 0.51], requires_grad=True)
    e_ref = torch.tensor([0.51, 0.51, 0.50, 0.50])
    a = torch.tensor([1.0, -1.0, 0.5, -0.5])
    group = torch.tensor([0, 0, 1, 1])
    surrogate_loss(e, e_ref, e.detach().clone(), a, group, 2, SETTINGS).backward()
    lg = [(1 * (0.50 - 0.51) - (0.52 - 0.51)) / 2, (0.5 * (0.49 - 0.50) - 0.5 * (0.51 - 0.50)) / 2]
    want = [_sigmoid(lg[i // 2]) * float(a[i]) / 4 + 2 * 0.001 * float(e.detach()[i] - e_ref[i]) / 4 for i in range(4)]
    assert torch.allclose(e.grad, torch.tensor(want), atol=1e-7)


def test_the_revised_target_loss_gradient_by_hand():
    """d/dx = -c / (D max(mean_d |x - r|, eps) B) for the squared form; the pseudo-Huber form's
    delta / sqrt(delta^2 + c^2) with delta = -c over the same normaliser."""
    torch.manual_seed(1)
    x = torch.randn(3, 2, 4, requires_grad=True)
    c, r = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    scale = (x.detach() - r).abs().flatten(1).mean(1).view(3, 1, 1)
    loss = revised_target_loss(x, c, r).mean()
    want = (0.5 * c.pow(2)).flatten(1).mean(1) / scale.flatten()
    assert torch.allclose(revised_target_loss(x, c, r), want, atol=1e-6)
    loss.backward()
    assert torch.allclose(x.grad, -c / (8 * scale * 3), atol=1e-6)
    x.grad = None
    revised_target_loss(x, c, r, huber_c=0.03).mean().backward()
    assert torch.allclose(x.grad, -c / torch.sqrt(c.pow(2) + 0.03 ** 2) / (8 * scale * 3), atol=1e-6)


def test_a_surrogate_equal_to_the_reference_gives_the_student_no_reward_signal():
    torch.manual_seed(2)
    x = torch.randn(4, 3, 5, requires_grad=True)
    x0_ref = torch.randn(4, 3, 5)
    student_reward_loss(x, x0_ref.clone(), x0_ref, None, 0.3).sum().backward()
    assert x.grad.abs().max() == 0
    x0_sur = x0_ref + 0.1 * torch.randn(4, 3, 5)
    student_reward_loss(x, x0_sur, x0_ref, None, 0.3).sum().backward()
    assert x.grad.abs().max() > 0


def test_the_student_reward_mixes_guidance_and_surrogate_convexly():
    torch.manual_seed(3)
    x = torch.randn(2, 6, requires_grad=True)
    sur, ref, cond = torch.randn(2, 6), torch.randn(2, 6), torch.randn(2, 6)
    g = guidance_direction(ref, cond, 4.5, 3.5)
    assert torch.allclose(g, 3.5 / 3.5 * (ref - cond))
    assert guidance_direction(ref, cond, 1.0, 3.5) is None and guidance_direction(ref, cond, 4.5, 0.0) is None
    got = student_reward_loss(x, sur, ref, g, 0.3)
    want = 0.3 * revised_target_loss(x, g, ref) + 0.7 * revised_target_loss(x, sur - ref, sur)
    assert torch.allclose(got, want, atol=1e-6)


def test_the_boundary_weight_ramps_with_the_boundary():
    assert [boundary_weight(k, 4) for k in (1, 2, 3, 4)] == [0.5, 0.75, 1.0, 1.25]


def test_the_coefficients_give_the_surrogate_loss_gradient_in_any_split_of_the_batch():
    """mean_i (c_i e_i + rb (e_i - e_ref_i)^2) over micro-batches, c from errors without grad, has the
    gradient of surrogate_loss on the whole batch, with both stops active on some rows."""
    torch.manual_seed(4)
    v = torch.randn(8, 6, requires_grad=True)
    target, v_ref = torch.randn(8, 6), torch.randn(8, 6)
    v_slow = v.detach() + 0.05 * torch.randn(8, 6)
    a = torch.randn(8).clamp(-5, 5)
    group = torch.arange(2).repeat_interleave(4)
    settings = dict(SETTINGS, threshold=0.5, clip=0.01)
    e_ref, e_slow = denoising_errors(target, v_ref), denoising_errors(target, v_slow)
    surrogate_loss(denoising_errors(target, v), e_ref, e_slow, a, group, 4, settings).backward()
    whole = v.grad.clone()
    v.grad = None
    with torch.no_grad():
        c = surrogate_coefficients(denoising_errors(target, v), e_ref, e_slow, a, group, 4, settings)
    assert (c == 0).any() and (c != 0).any()
    for rows in (slice(0, 3), slice(3, 8)):
        e = denoising_errors(target[rows], v[rows])
        ((c[rows] * e + settings["reference_beta"] * (e - e_ref[rows]).pow(2)).sum() / 8).backward()
    assert torch.allclose(v.grad, whole, atol=1e-7)
