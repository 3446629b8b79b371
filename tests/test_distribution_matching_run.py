"""Distribution matching in the loop (`algorithm.distribution_matching`, DMD2 / DMDR) on the tiny SD3:
a fake score equal to the real one gives zero DMD gradient; the student's gradient against one
written by hand from the family's own predictions; the fake score's updates and the student's
steps; the fake score and its optimizer through a checkpoint; DMDR keeps the reward advantage and
its dynamic guidance judges by the blended weights; the recipe errors that name the field."""

import copy

import pytest
import torch
from helpers import TINY_IMAGE_RECIPE as IMAGE_RECIPE
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.config.parse import ConfigError, parse_config
from mmrl.core.distribution_matching import noise_levels
from mmrl.core.seeding import derive_seed
from mmrl.train.loop.trainer import Trainer

DM = "algorithm.distribution_matching"


def dmd_trainer(tmp_path, *extra):
    return Trainer(parse_config(IMAGE_RECIPE, [f"output_dir={tmp_path}", f"{DM}.enabled=true", *extra]))


def student_grads(t, batch, rows):
    """The student's parameter gradients of the micro-batch's summed unit DMD losses."""
    t.model.zero_grad(set_to_none=True)
    mb = batch.rollout.select(rows)
    units = slice(None)
    losses = t.updater.scores.unit_losses(t.model, mb, units)
    (losses * mb.unit_mask).sum().backward()
    return {n: p.grad.clone() for n, p in t.unwrapped.named_parameters() if p.grad is not None}, losses


def test_a_fake_score_equal_to_the_real_one_gives_zero_dmd_gradient(tmp_path):
    t = dmd_trainer(tmp_path, f"{DM}.fake_updates_per_step=0", f"{DM}.real_guidance=false")
    batch = t.prepare_batch(1)
    grads, losses = student_grads(t, batch, torch.arange(len(batch.rollout)))
    assert batch.rollout.unit_mask.sum() > 0
    assert losses.abs().max() == 0 and all(g.abs().max() == 0 for g in grads.values())


def test_the_student_gradient_against_a_hand_written_reference(tmp_path):
    """x0 = x_k - s_k v(x_k); re-noised x = (1 - s) x0 + s eps with the pair's draws; the real (a tiny SD3 of
    another seed, unguided) and the fake's x0 by the family's predict; g = ((x0 - x0_real) - (x0 - x0_fake))
    / mean|x0 - x0_real|; the loss's gradient is that of sum_d sg(g) x0 / D."""
    t = dmd_trainer(tmp_path, f"{DM}.real={{tiny_args: {{seed: 1}}}}", f"{DM}.fake_updates_per_step=1",
                    f"{DM}.real_guidance=false")
    batch = t.prepare_batch(1)
    t.updater.scores.train_fake(batch.rollout, [torch.arange(len(batch.rollout))])  # the fake now differs
    pair, policy, r = t.updater.scores, t.policy, batch.rollout
    draws = pair.draws
    grads, _ = student_grads(t, batch, torch.arange(len(r)))
    t.model.zero_grad(set_to_none=True)
    ex, fam, dm = r.extras, policy.family, t.cfg.algorithm.distribution_matching
    cond = {k: v for k, v in ex.items() if k.startswith(("pos/", "neg/"))}
    total = 0.0
    for k in range(r.num_units):
        rows = r.unit_mask[:, k].nonzero().flatten()
        gen = torch.Generator().manual_seed(derive_seed(t.cfg.seed, draws + k + 1, 0, 0xD3D))
        levels = noise_levels(len(r), dm.min_level, dm.max_level, gen)
        noise = torch.randn(ex["latents"][:, k].shape, generator=gen)
        if not len(rows):
            continue
        x = ex["latents"][rows, k]
        c = {key: v[rows] for key, v in cond.items()}
        pc = policy.cfg  # the student's step prediction is the rollout's, guided as it was
        v = fam.predict(t.model, x, ex["timesteps"][0, k], c, pc.guidance_scale, pc.classifier_free_guidance)
        x0 = x - float(ex["levels"][0, k]) * v.float()
        s = levels[rows].view(-1, 1, 1, 1)
        noisy = (1 - s) * x0.detach() + s * noise[rows]
        with torch.no_grad():
            real, fake = (noisy - s * fam.predict(m, noisy, levels[rows] * 1000, c, 1.0, False).float()
                          for m in (pair.real, pair.fake))
        p_real, p_fake = x0.detach() - real, x0.detach() - fake
        g = (p_real - p_fake) / p_real.abs().mean(dim=(1, 2, 3), keepdim=True)
        total = total + (g * x0).flatten(1).sum(1).sum() / x0[0].numel()
    total.backward()
    want = {n: p.grad for n, p in t.unwrapped.named_parameters() if p.grad is not None}
    assert set(want) == set(grads) and any(g.abs().max() > 0 for g in want.values())
    for n in want:
        assert torch.allclose(grads[n], want[n], atol=1e-6, rtol=1e-4), n


def test_dmd2_trains_two_steps_and_the_fake_score_survives_a_checkpoint(tmp_path):
    t = dmd_trainer(tmp_path, f"{DM}.fake_updates_per_step=2", f"{DM}.fake_lr=1e-3", "max_steps=2")
    before = {n: p.detach().clone() for n, p in t.unwrapped.named_parameters()}
    fake_before = {n: p.detach().clone() for n, p in t.updater.scores.fake.named_parameters()}
    for _ in range(2):
        metrics = t.train_step()
        assert metrics["dmd_loss"] > 0 and metrics["dmd_fake_loss"] > 0 and metrics["skipped_frac"] == 0.0
    t.step = 2
    assert any(not torch.equal(before[n], p) for n, p in t.unwrapped.named_parameters())
    fake = {n: p.detach().clone() for n, p in t.updater.scores.fake.named_parameters()}
    assert any(not torch.equal(fake_before[n], fake[n]) for n in fake)
    t.save_checkpoint()
    t.release_output_dir()
    resumed = Trainer(parse_config(IMAGE_RECIPE, [f"output_dir={tmp_path}", f"{DM}.enabled=true", "max_steps=2",
                                                  f"{DM}.fake_updates_per_step=2", f"{DM}.fake_lr=1e-3", "resume=true"]))
    assert resumed.step == 2
    pair = resumed.updater.scores
    assert all(torch.equal(fake[n], p) for n, p in pair.fake.named_parameters())
    assert pair.draws == t.updater.scores.draws and len(pair.optimizer.state) > 0


def test_dmdr_keeps_the_reward_advantage_and_dmd2_drops_it(tmp_path):
    for with_reward in (True, False):
        t = dmd_trainer(tmp_path / str(with_reward), f"{DM}.with_reward={str(with_reward).lower()}")
        batch = t.prepare_batch(1)
        prepared = t.updater.scores.prepared(batch, t.updater.micro_batches(batch), t.model)
        assert batch.advantages.abs().max() > 0
        if with_reward:
            assert torch.equal(prepared.advantages, batch.advantages)
        else:
            assert prepared.advantages.abs().max() == 0


def test_dmdr_dynamic_renoise_levels_follow_the_schedule_and_its_step_survives_a_checkpoint(tmp_path):
    """level_sampling: beta draws the DMD levels from Beta(a, b) at the pair's student step (DMDR's dynamic
    renoise sampling), the step count is saved with the fake score."""
    from mmrl.core.distribution_matching import beta_levels, beta_schedule
    extra = [f"{DM}.level_sampling=beta", f"{DM}.level_decay_steps=4", f"{DM}.fake_updates_per_step=1", "max_steps=1"]
    t = dmd_trainer(tmp_path, *extra)
    t.train_step()
    pair = t.updater.scores
    assert pair.steps == 1
    draws = pair.draws
    got = pair.levels(64, 0.02, 0.98, pair.generator())
    gen = torch.Generator().manual_seed(derive_seed(t.cfg.seed, draws + 1, 0, 0xD3D))
    assert torch.equal(got, beta_levels(64, 0.02, 0.98, beta_schedule(4.0, 1.5, 1, 4), gen))
    t.step = 1
    t.save_checkpoint()
    t.release_output_dir()
    resumed = Trainer(parse_config(IMAGE_RECIPE, [f"output_dir={tmp_path}", f"{DM}.enabled=true", *extra, "resume=true"]))
    assert resumed.updater.scores.steps == 1


def test_dmdr_dynamic_guidance_judges_by_blended_weights_and_decays_to_the_teacher(tmp_path):
    """dynamic_guidance m0 over T steps: at step 0 the student's DMD losses are those of a real score whose
    weights are real + m0 (fake - real) by hand (same draws); m0 = 1 makes the real score the fake one (zero
    loss); from step T on the real score is the teacher."""
    extra = [f"{DM}.dynamic_guidance=0.5", f"{DM}.dynamic_guidance_steps=4", f"{DM}.fake_updates_per_step=1",
             f"{DM}.fake_lr=1e-3", f"{DM}.real_guidance=false"]
    t = dmd_trainer(tmp_path, *extra)
    batch = t.prepare_batch(1)
    pair, rows = t.updater.scores, torch.arange(len(batch.rollout))
    t.updater.scores.prepared(batch, [rows], t.model)
    assert pair.steps == 1 and pair.mix == 0.5 and pair.judge() is pair.guide
    draws, mb = pair.draws, batch.rollout.select(rows)
    got = pair.unit_losses(t.model, mb, slice(None)).detach()
    teacher = pair.real
    hand = {n: r + 0.5 * (f - r) if r.is_floating_point() else r
            for (n, r), f in zip(teacher.state_dict().items(), pair.fake.state_dict().values())}
    by_hand = copy.deepcopy(teacher)
    by_hand.load_state_dict(hand)
    pair.real, pair.mix, pair.draws = by_hand, 0.0, draws
    want = pair.unit_losses(t.model, mb, slice(None)).detach()
    assert got.abs().max() > 0 and torch.allclose(got, want, rtol=1e-4, atol=1e-7)
    pair.real, pair.steps = teacher, 0
    t.cfg.algorithm.distribution_matching.dynamic_guidance = 1.0
    pair.refresh_guidance()
    assert pair.unit_losses(t.model, mb, slice(None)).abs().max() == 0  # the real score is the fake one
    pair.steps = 4
    pair.refresh_guidance()
    assert pair.mix == 0.0 and pair.judge() is pair.real


@pytest.mark.parametrize("recipe, extra, message", [
    (TINY_RECIPE, [], "has no score model of its samples"),
    (IMAGE_RECIPE, ["algorithm.objective=wd1"], "algorithm.objective='wd1' takes none"),
    (IMAGE_RECIPE, [f"{DM}.min_level=0.9", f"{DM}.max_level=0.5"], f"{DM}.min_level=0.9"),
    (IMAGE_RECIPE, [f"{DM}.level_sampling=beta", f"{DM}.level_alpha=0"], f"{DM}.level_alpha=0"),
    (IMAGE_RECIPE, ["policy.units=forward_process", "algorithm.objective=nft"], "policy.units='forward_process'"),
    (IMAGE_RECIPE, [f"{DM}.dynamic_guidance=0.25", f"{DM}.dynamic_guidance_steps=0"], f"{DM}.dynamic_guidance=0.25"),
])
def test_recipe_errors_name_the_field(tmp_path, recipe, extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Trainer(parse_config(recipe, tiny_overrides(tmp_path) + [f"{DM}.enabled=true", *extra]))


@pytest.mark.parametrize("with_reward", ["false", "true"])
def test_the_t2i_dmd2_recipe_trains_two_steps_after_a_warm_start(tmp_path, with_reward):
    """The shipped recipe on the tiny pixel UNet (a 3-step warm start here): the scores start from the warm-started
    student, the fake score moves, the student trains; with_reward=true is DMDR."""
    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES
    t = Trainer(load_recipe(RECIPES.get("t2i_dmd2"), [
        f"output_dir={tmp_path}", "algorithm.group_size=2", "optim.prompts_per_step=1", "max_steps=2",
        "warm_start.steps=3", "logging.progress=false", "logging.report_to=[none]", f"{DM}.fake_updates_per_step=2",
        f"{DM}.with_reward={with_reward}"]))
    t.warm_start()
    pair = t.updater.scores
    assert all(torch.equal(p, q) for p, q in zip(pair.real.parameters(), t.unwrapped.parameters()))
    for _ in range(2):
        metrics = t.train_step()
        assert metrics["dmd_loss"] > 0 and metrics["ratio_max_dev"] == 0.0
    assert any(not torch.equal(p, q) for p, q in zip(pair.fake.parameters(), pair.real.parameters()))


def test_several_processes_are_refused_with_the_recipe(tmp_path):
    from mmrl.train.plan.validate import validate
    cfg = parse_config(IMAGE_RECIPE, [f"output_dir={tmp_path}", f"{DM}.enabled=true"])
    with pytest.raises(ConfigError, match=f"{DM}.enabled=true trains its fake score in one process; this run has 2"):
        validate(cfg, num_processes=2)


@pytest.mark.parametrize("model, guided", [("tiny:wan-t2v", True), ("tiny:hunyuan-video", False)])
def test_the_score_hooks_of_video_families(model, guided):
    """On video latents [N, C, F, H, W]: each trained step's clean prediction x - s v(x) by the family's own
    predict, a score model's clean prediction at a re-noised sample (with and without guidance), and zero DMD
    gradient for a fake score equal to the real one."""
    from mmrl.core.distribution_matching import dmd_gradient
    from mmrl.tasks.diffusion.config import DiffusionConfig
    from mmrl.tasks.diffusion.policy import DiffusionPolicy
    policy = DiffusionPolicy(DiffusionConfig(model=model, height=32, width=32, num_frames=5, num_steps=3,
                                             eval_num_steps=3, sampler="flow_sde", noise_level=0.7,
                                             classifier_free_guidance=guided))
    r = policy.rollout([{"prompt": "red circle"}], 2, seeds=[3])
    with torch.no_grad():
        clean = policy.clean_predictions(policy.model, r, slice(0, 1))
        rows = r.unit_mask[:, 0].nonzero().flatten()
        x = r.extras["latents"][rows, 0]
        cond = {k: v[rows] for k, v in r.extras.items() if k.startswith(("pos/", "neg/"))}
        v = policy.family.predict(policy.model, x, r.extras["timesteps"][0, 0], cond, policy.cfg.guidance_scale, guided)
        assert clean.shape[2:] == r.extras["latents"].shape[2:] and clean.dim() == 6
        assert torch.allclose(clean[rows, 0], x - float(r.extras["levels"][0, 0]) * v.float(), atol=1e-5)
        samples = policy.generated_samples(r)
        levels, noise = torch.tensor([0.3, 0.8]), torch.randn(samples.shape, generator=torch.Generator().manual_seed(0))
        for with_guidance in (True, False):
            x0, loss = policy.denoised(policy.model, r, samples, levels, noise, with_guidance)
            assert x0.shape == samples.shape and loss.shape == (2,) and torch.isfinite(loss).all()
        real, _ = policy.denoised(policy.model, r, samples, levels, noise, False)
        assert dmd_gradient(samples, real, x0).abs().max() == 0
        s = levels.view(-1, 1, 1, 1, 1)
        noisy = (1 - s) * samples + s * noise
        c = {k: val for k, val in r.extras.items() if k.startswith(("pos/", "neg/"))}  # each row at its own level
        v = policy.family.predict(policy.model, noisy, levels * 1000, c, policy.cfg.guidance_scale, False).float()
        assert torch.allclose(x0, noisy - s * v, atol=1e-5)
