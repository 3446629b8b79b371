"""DMD2's gradient and loss (mmrl/core/distribution_matching.py) against hand-written references: a
fake score equal to the real one gives zero gradient, the normalised gradient by hand, the loss's
gradient in the sample g / D, the re-noising levels in their range, DMDR's dynamic guidance (its
cosine-decayed mix and the blended weights, against a LoRA at that scale written by hand)."""

import torch

import math

from mmrl.core.distribution_matching import (beta_levels, beta_schedule, blend_weights, dmd_gradient, dmd_loss,
                                             guidance_mix, noise_levels)


def test_a_fake_score_equal_to_the_real_one_gives_zero_gradient():
    torch.manual_seed(0)
    x, x0 = torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)
    g = dmd_gradient(x, x0, x0.clone())
    assert g.abs().max() == 0
    x.requires_grad_(True)
    dmd_loss(x, g).sum().backward()
    assert x.grad.abs().max() == 0


def test_the_gradient_against_a_hand_written_reference():
    """g[b] = (x0_fake - x0_real) / mean |x - x0_real| per row, written element by element."""
    torch.manual_seed(1)
    x, real, fake = torch.randn(2, 3, 2), torch.randn(2, 3, 2), torch.randn(2, 3, 2)
    g = dmd_gradient(x, real, fake)
    for b in range(2):
        scale = sum(abs(float(x[b, i, j] - real[b, i, j])) for i in range(3) for j in range(2)) / 6
        for i in range(3):
            for j in range(2):
                want = (float(x[b, i, j] - real[b, i, j]) - float(x[b, i, j] - fake[b, i, j])) / scale
                assert abs(float(g[b, i, j]) - want) < 1e-5


def test_the_loss_moves_the_sample_along_minus_g_and_zero_scale_gives_zero():
    """d/dx 0.5 mean_d (x - sg(x - g))^2 = g / D, through a generator x = w * z (chain rule by hand)."""
    torch.manual_seed(2)
    w, z = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5)
    x = w * z
    g = dmd_gradient(x, torch.randn(4, 5), torch.randn(4, 5))
    dmd_loss(x, g).sum().backward()
    assert torch.allclose(w.grad, g * z / 5, atol=1e-6)
    assert torch.isfinite(dmd_gradient(x, x, torch.randn(4, 5))).all()  # mean |p_real| = 0: nan -> 0, inf -> max


def test_noise_levels_lie_in_their_range_and_follow_the_generator():
    a = noise_levels(1000, 0.02, 0.98, torch.Generator().manual_seed(3))
    assert 0.02 <= float(a.min()) and float(a.max()) <= 0.98 and abs(float(a.mean()) - 0.5) < 0.03
    assert torch.equal(a, noise_levels(1000, 0.02, 0.98, torch.Generator().manual_seed(3)))


def test_dmdr_dynamic_beta_schedule_by_hand():
    """a = 1 + (alpha - 1) c, b = 1 + (beta - 1) c, c = (1 + cos(pi min(step / T, 1))) / 2."""
    assert beta_schedule(4.0, 1.5, 0, 1000) == (4.0, 1.5)
    a, b = beta_schedule(4.0, 1.5, 250, 1000)
    c = (1 + math.cos(math.pi / 4)) / 2
    assert abs(a - (1 + 3 * c)) < 1e-12 and abs(b - (1 + 0.5 * c)) < 1e-12
    assert beta_schedule(4.0, 1.5, 1000, 1000) == (1.0, 1.0) == beta_schedule(4.0, 1.5, 5000, 1000)
    assert beta_schedule(4.0, 1.5, 5000, 0) == (4.0, 1.5)


def test_beta_levels_are_torch_beta_draws_from_the_generators_seed_in_range():
    gen = torch.Generator().manual_seed(7)
    got = beta_levels(20000, 0.02, 0.98, (4.0, 1.5), gen)
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=torch.Generator().manual_seed(7)))
    torch.manual_seed(seed)
    want = 0.02 + 0.96 * torch.distributions.Beta(torch.tensor(4.0), torch.tensor(1.5)).sample((20000,))
    assert torch.equal(got, want)
    assert 0.02 <= float(got.min()) and float(got.max()) <= 0.98
    assert abs(float((got.mean() - 0.02) / 0.96) - 4.0 / 5.5) < 0.01  # the Beta's mean a / (a + b)


def test_dmdr_dynamic_guidance_mix_by_hand():
    """m = scale (1 + cos(pi step / T)) / 2 before T, 0 from T on and always with T = 0 (Flow-Factory's
    lora_scale_r with dynamic_step 0)."""
    assert guidance_mix(0.25, 0, 1000) == 0.25
    assert abs(guidance_mix(0.25, 250, 1000) - 0.25 * (1 + math.cos(math.pi / 4)) / 2) < 1e-15
    assert abs(guidance_mix(0.25, 500, 1000) - 0.125) < 1e-15
    assert guidance_mix(0.25, 1000, 1000) == 0.0 == guidance_mix(0.25, 4000, 1000) == guidance_mix(0.25, 0, 0)


def test_blended_weights_are_a_lora_at_the_mix_scale_by_hand():
    """A fake score W0 + B A (a LoRA at scale 1 merged) and the real W0: the blend at m is W0 + m B A, the
    LoRA at scale m, on every floating tensor; an integer buffer is the real score's."""
    torch.manual_seed(0)
    real = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5))
    real[1].running_mean.normal_()
    b, a = torch.randn(5, 2), torch.randn(2, 6)
    fake, blend = (torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5)) for _ in range(2))
    fake.load_state_dict(real.state_dict())
    with torch.no_grad():
        fake[0].weight += b @ a
        fake[1].running_mean += 1.0
    fake[1].num_batches_tracked += 7
    for m in (0.0, 0.25, 1.0):
        blend_weights(blend, real, fake, m)
        assert torch.allclose(blend[0].weight, real[0].weight + m * (b @ a), atol=1e-6)
        assert torch.equal(blend[0].bias, real[0].bias)
        assert torch.allclose(blend[1].running_mean, real[1].running_mean + m, atol=1e-6)
        assert int(blend[1].num_batches_tracked) == 0
        x = torch.randn(3, 6)
        lora = x @ real[0].weight.T + m * (x @ a.T @ b.T) + real[0].bias
        assert torch.allclose(blend[0](x), lora, atol=1e-5)
