"""TDM-R1's surrogate reward in the loop (`algorithm.distribution_matching.surrogate_reward`) on the tiny
SD3: a surrogate equal to the real score (and a fake equal to it) gives the student no signal; the
surrogate's gradient in one step against the whole-batch loss written from the family's own denoising
errors (mmrl/core/surrogate_reward.py's `surrogate_loss`, split over two micro-batches in the run);
two steps train the surrogate, its slow copy follows, and both survive a checkpoint; recipe errors
name the field; the shipped recipe trains two steps."""

import copy

import pytest
import torch
from helpers import TINY_IMAGE_RECIPE as IMAGE_RECIPE
from helpers import tiny_overrides

from mmrl.config.parse import ConfigError, parse_config
from mmrl.core.distribution_matching import noise_levels
from mmrl.core.surrogate_reward import boundary_weight, surrogate_loss
from mmrl.train.loop.trainer import Trainer

DM = "algorithm.distribution_matching"
SR = f"{DM}.surrogate_reward"


def tdm_trainer(tmp_path, *extra):
    return Trainer(parse_config(IMAGE_RECIPE, [f"output_dir={tmp_path}", f"{DM}.enabled=true", f"{SR}.enabled=true",
                                               *extra]))


def test_a_surrogate_equal_to_the_real_score_gives_the_student_no_signal(tmp_path):
    t = tdm_trainer(tmp_path, f"{DM}.fake_updates_per_step=0", f"{DM}.real_guidance=false")
    batch = t.prepare_batch(1)
    mb = batch.rollout
    t.model.zero_grad(set_to_none=True)
    losses = t.updater.scores.unit_losses(t.model, mb, slice(None))
    (losses * mb.unit_mask).sum().backward()
    grads = [p.grad for p in t.unwrapped.parameters() if p.grad is not None]
    assert mb.unit_mask.sum() > 0 and losses.abs().max() == 0 and all(g.abs().max() == 0 for g in grads)
    with torch.no_grad():  # a surrogate that differs gives a signal
        for p in t.updater.scores.surrogate.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert t.updater.scores.unit_losses(t.model, mb, slice(None)).abs().max() > 0


def test_the_surrogate_gradient_against_the_whole_batch_loss(tmp_path):
    """The run's streamed loss (coefficients from errors without grad, two micro-batches) against
    sum_k w_k surrogate_loss_k / K on the whole batch, the errors the family's own flow-matching losses at
    the same draws; a surrogate and a slow copy moved off the real score so that both stops and the group
    weights take part."""
    t = tdm_trainer(tmp_path, f"{DM}.fake_updates_per_step=0", f"{SR}.threshold=1e-4", f"{SR}.clip=0.01")
    batch = t.prepare_batch(1)
    sur, r = t.updater.scores.surrogate, batch.rollout
    torch.manual_seed(5)
    with torch.no_grad():
        for p, q in zip(sur.model.parameters(), sur.slow.parameters()):
            p.add_(0.02 * torch.randn_like(p))
            q.add_(0.02 * torch.randn_like(q))
    start = copy.deepcopy(sur.model)
    slow = copy.deepcopy(sur.slow)
    n = len(r)
    sur.train(r, [torch.arange(n // 2), torch.arange(n // 2, n)], batch.advantages, t.model,
              lambda: torch.Generator().manual_seed(11))
    got = {name: p.grad.clone() for name, p in sur.model.named_parameters() if p.grad is not None}
    policy, dm, s = t.policy, t.cfg.algorithm.distribution_matching, sur.settings
    settings = {"beta": s.beta, "reference_beta": s.reference_beta, "threshold": s.threshold, "clip": s.clip}
    _, group = torch.unique(r.group_id, return_inverse=True)
    units = r.unit_mask.shape[1]
    with torch.no_grad():
        clean = policy.clean_predictions(t.model, r, slice(0, units)).float()
    total, active = 0.0, [k for k in range(units) if r.unit_mask[:, k].any()]
    assert r.unit_mask[:, active].all() and len(active) > 1
    for k in active:
        gen = torch.Generator().manual_seed(11)
        levels = noise_levels(n, dm.min_level, dm.max_level, gen)
        noise = torch.randn(clean[:, k].shape, generator=gen)
        e = policy.denoised(start, r, clean[:, k], levels, noise, False)[1]
        with torch.no_grad():
            e_ref, e_slow = (policy.denoised(m, r, clean[:, k], levels, noise, False)[1] for m in (sur.real, slow))
        adv = batch.advantages.float().clamp(-5, 5)
        total = total + boundary_weight(k + 1, units) * surrogate_loss(e, e_ref, e_slow, adv, group,
                                                                       t.cfg.algorithm.group_size, settings) / len(active)
    total.backward()
    want = {name: p.grad for name, p in start.named_parameters() if p.grad is not None}
    assert set(want) == set(got) and any(g.abs().max() > 0 for g in want.values())
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-7, rtol=1e-4), name


def test_tdm_r1_trains_two_steps_and_the_surrogate_survives_a_checkpoint(tmp_path):
    extra = [f"{DM}.fake_updates_per_step=1", f"{SR}.lr=1e-3", "max_steps=2"]
    t = tdm_trainer(tmp_path, *extra)
    sur = t.updater.scores.surrogate
    before = [p.detach().clone() for p in sur.model.parameters()]
    for _ in range(2):
        metrics = t.train_step()
        assert metrics["surrogate_loss"] != 0 and metrics["dmd_loss"] > 0
    t.step = 2
    assert sur.updates == 2 and any(not torch.equal(a, p) for a, p in zip(before, sur.model.parameters()))
    assert any(not torch.equal(a, p) for a, p in zip(before, sur.slow.parameters()))
    t.save_checkpoint()
    t.release_output_dir()
    resumed = tdm_trainer(tmp_path, *extra, "resume=true").updater.scores.surrogate
    assert resumed.updates == 2 and len(resumed.optimizer.state) > 0
    assert all(torch.equal(p, q) for p, q in zip(resumed.model.parameters(), sur.model.parameters()))
    assert all(torch.equal(p, q) for p, q in zip(resumed.slow.parameters(), sur.slow.parameters()))


@pytest.mark.parametrize("extra, message", [
    ([f"{DM}.with_reward=true"], f"{SR}.enabled=true: the reward reaches the student through the surrogate"),
    ([f"{SR}.tdm_weight=1.0"], f"{SR}.tdm_weight=1.0 must lie in (0, 1)"),
    ([f"{SR}.slow_decay_min=0.5", f"{SR}.slow_decay_max=0.1"], f"{SR}.slow_decay_min=0.5"),
])
def test_recipe_errors_name_the_field(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Trainer(parse_config(IMAGE_RECIPE, tiny_overrides(tmp_path) + [f"{DM}.enabled=true", f"{SR}.enabled=true",
                                                                        *extra]))


def test_the_t2i_tdm_r1_recipe_trains_two_steps_after_a_warm_start(tmp_path):
    """The shipped recipe on the tiny pixel UNet (a 3-step warm start here): the surrogate starts as the
    warm-started real score, then it, its slow copy and the student move."""
    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES
    t = Trainer(load_recipe(RECIPES.get("t2i_tdm_r1"), [
        f"output_dir={tmp_path}", "algorithm.group_size=2", "optim.prompts_per_step=1", "max_steps=2",
        "warm_start.steps=3", "logging.progress=false", "logging.report_to=[none]", f"{DM}.fake_updates_per_step=1"]))
    t.warm_start()
    pair = t.updater.scores
    assert all(torch.equal(p, q) for p, q in zip(pair.surrogate.model.parameters(), t.unwrapped.parameters()))
    student = [p.detach().clone() for p in t.unwrapped.parameters()]
    for _ in range(2):
        metrics = t.train_step()
        assert metrics["dmd_loss"] > 0 and metrics["surrogate_loss"] != 0
    assert any(not torch.equal(p, q) for p, q in zip(pair.surrogate.model.parameters(), pair.real.parameters()))
    assert any(not torch.equal(p, q) for p, q in zip(t.unwrapped.parameters(), student))


def test_a_video_family_with_guidance_trains_a_step_and_the_guidance_reward_joins(tmp_path):
    """Tiny Wan (video latents [N, C, F, H, W]) with classifier-free guidance: the student's loss takes the
    guidance reward s_r / (s - 1) (x0_guided - x0_cond) beside the surrogate's (dropped with s_r = 0), and a
    step trains the surrogate."""
    from pathlib import Path
    video = dict(IMAGE_RECIPE, rewards={"mean_red_video": {"weight": 1.0}},
                 reward_modules=[str(Path(__file__).parent / "video_reward.py")])
    t = Trainer(parse_config(video, [f"output_dir={tmp_path}", f"{DM}.enabled=true", f"{SR}.enabled=true",
                                     "policy.model=tiny:wan-t2v", "policy.num_frames=5", "policy.height=16",
                                     "policy.width=16", "policy.classifier_free_guidance=true",
                                     "policy.guidance_scale=4.5", f"{DM}.fake_updates_per_step=0"]))
    assert t.policy.guidance_scale() == 4.5
    batch = t.prepare_batch(1)
    pair = t.updater.scores
    draws = pair.draws
    with_guidance = pair.unit_losses(t.model, batch.rollout, slice(None))
    pair.surrogate.settings.guidance_reward_scale, pair.draws = 0.0, draws  # the same draws again
    without = pair.unit_losses(t.model, batch.rollout, slice(None))
    trained = batch.rollout.unit_mask > 0
    # the surrogate equals the real score (no surrogate reward); the difference is the guidance reward, > 0
    assert (with_guidance - without)[trained].min() > 0
    before = [p.detach().clone() for p in pair.surrogate.model.parameters()]
    metrics = t.train_step()
    assert metrics["surrogate_loss"] != 0
    assert any(not torch.equal(a, p) for a, p in zip(before, pair.surrogate.model.parameters()))


def test_the_slow_copy_follows_with_the_decay_of_the_surrogates_earlier_steps(tmp_path):
    """slow <- d slow + (1 - d) surrogate, d = min(0.3, 0.001 + 0.001 n) after n earlier steps (Flow-Factory's
    update_variant_snapshot with TDM-R1's decay)."""
    sur = tdm_trainer(tmp_path).updater.scores.surrogate
    for n, d in ((5, 0.006), (400, 0.3)):
        sur.updates = n
        with torch.no_grad():
            for p in sur.model.parameters():
                p.add_(torch.randn_like(p))
        slow, live = ([p.detach().clone() for p in m.parameters()] for m in (sur.slow, sur.model))
        sur.follow_slow_copy()
        for a, b, got in zip(slow, live, sur.slow.parameters()):
            assert torch.allclose(got, d * a + (1 - d) * b, atol=1e-6)
