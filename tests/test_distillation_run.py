"""On-policy distillation in the loop (`algorithm.distill`): the teacher built through the student's
adapter, its divergence on the student's rollouts against independent computations (the log-probs
on the whole batch, the logits of the model's own forward, the step means by hand), zero for a
teacher equal to the student, a training step, and the recipe errors that name the field."""


import pytest
import torch
from helpers import TINY_IMAGE_RECIPE as IMAGE_RECIPE
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.config.parse import ConfigError, parse_config
from mmrl.core.distillation import generalized_jsd
from mmrl.train.loop.trainer import Trainer


def text_trainer(tmp_path, teacher_seed, *extra):
    teacher = f"{{model: 'tiny:qwen2-char', tiny_args: {{hidden: 32, layers: 1, heads: 2, seed: {teacher_seed}}}}}"
    return Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path) + [f"algorithm.distill.teacher={teacher}",
                                                                        *extra]))


def divergence_of(trainer):
    batch = trainer.prepare_batch(1)
    return batch, trainer.updater.teacher_divergence(batch, trainer.updater.micro_batches(batch))


@pytest.mark.parametrize("divergence", ["sampled", "jsd"])
def test_a_teacher_equal_to_the_student_gives_zero_signal_in_the_loop(tmp_path, divergence):
    t = text_trainer(tmp_path, 0, f"algorithm.distill.divergence={divergence}")
    batch, d = divergence_of(t)
    assert batch.rollout.unit_mask.sum() > 0
    assert d.abs().max() < 1e-6
    distilled = t.updater.distilled(batch, t.updater.micro_batches(batch))
    mask = batch.rollout.unit_mask * batch.row_mask[:, None]
    assert torch.allclose(distilled.advantages, batch.advantages[:, None] * mask, atol=1e-6)


def test_sampled_and_jsd_divergences_against_independent_passes(tmp_path):
    """sampled: log pi_s - log pi_t of the whole batch in one call; jsd: GKD's JSD of the logits of the
    models' own forward on prompt + completion (the teacher a Qwen2 of another seed)."""
    t = text_trainer(tmp_path, 1, "algorithm.distill.divergence=sampled", "optim.micro_batch_size=3")
    batch, d = divergence_of(t)
    r, mask = batch.rollout, batch.rollout.unit_mask.bool()
    with torch.no_grad():
        want = t.policy.logprobs(t.model, r)[0] - t.policy.logprobs(t.updater.teachers.modules["teacher"], r)[0]
    assert d[mask].abs().max() > 1e-3
    assert torch.allclose(d[mask], want[mask], atol=1e-5)
    t.cfg.algorithm.distill.divergence, t.cfg.algorithm.distill.beta = "jsd", 0.3
    d = t.updater.teacher_divergence(batch, t.updater.micro_batches(batch))
    ids = torch.cat([r.extras["prompt_ids"], r.extras["completion_ids"]], 1)
    attention = torch.cat([r.extras["prompt_mask"], r.unit_mask.to(r.extras["prompt_mask"].dtype)], 1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    c = r.extras["completion_ids"].shape[1]
    with torch.no_grad():
        s, te = (m(input_ids=ids, attention_mask=attention, position_ids=positions).logits[:, -(c + 1):-1]
                 for m in (t.unwrapped, t.updater.teachers.modules["teacher"]))
    want = generalized_jsd(s / t.policy.cfg.temperature, te / t.policy.cfg.temperature, 0.3)
    assert torch.allclose(d[mask], want[mask], atol=1e-5)


def test_a_distillation_step_trains_and_logs_the_divergence(tmp_path):
    t = text_trainer(tmp_path, 1, "algorithm.distill.with_reward=false", "algorithm.distill.weight=0.5")
    before = {n: p.detach().clone() for n, p in t.unwrapped.named_parameters()}
    metrics = t.train_step()
    # a one-sample estimate of the reverse KL: non-zero, of either sign
    assert metrics["distill_divergence"] != 0 and metrics["skipped_frac"] == 0.0
    assert any(not torch.equal(before[n], p) for n, p in t.unwrapped.named_parameters())


def test_closed_form_step_kl_of_a_flow_teacher_replaying_the_students_states(tmp_path):
    """The teacher's step mean at the student's own SDE states: KL = mean_d (mu_s - mu_t)^2 / (2 std^2),
    by hand from `step_means`; zero for a teacher equal to the student."""
    same = Trainer(parse_config(IMAGE_RECIPE, [f"output_dir={tmp_path / 'same'}", "algorithm.distill.teacher={tiny_args: {seed: 0}}",
                                               "algorithm.distill.divergence=closed_form"]))
    assert divergence_of(same)[1].abs().max() < 1e-7
    t = Trainer(parse_config(IMAGE_RECIPE, [f"output_dir={tmp_path / 'other'}", "algorithm.distill.teacher={tiny_args: {seed: 1}}",
                                            "algorithm.distill.divergence=closed_form"]))
    batch, d = divergence_of(t)
    r, rows = batch.rollout, torch.arange(len(batch.rollout))
    compared = 0
    with torch.no_grad():
        for k in range(r.num_units):
            on = r.unit_mask[:, k].bool()
            if not on.any():  # a step the sampler takes deterministically trains nothing
                continue
            mu_s, std = t.policy.step_means(t.model, r, k, rows)
            mu_t, _ = t.policy.step_means(t.updater.teachers.modules["teacher"], r, k, rows)
            want = ((mu_s - mu_t) ** 2 / (2 * std ** 2)).flatten(1).mean(1).cpu()
            assert want[on].min() > 0
            assert torch.allclose(d[on, k], want[on], rtol=1e-4, atol=1e-8)
            compared += int(on.sum())
    assert compared > 0


@pytest.mark.parametrize("recipe,overrides,message", [
    (TINY_RECIPE, ["algorithm.distill.teacher={modle: x}"], "algorithm.distill.teacher.modle"),
    (TINY_RECIPE, ["algorithm.distill.teacher={model: ./nowhere}"], "algorithm.distill.teacher.model: local path"),
    (TINY_RECIPE, ["algorithm.distill.teacher={model: x}", "algorithm.distill.divergence=closed_form"],
     "divergence='closed_form' needs the adapter's exact per-unit KL"),
    (TINY_RECIPE, ["algorithm.distill.teacher={model: x}", "algorithm.objective=wd1"], "objective='wd1'"),
    (TINY_RECIPE, ["algorithm.distill.teacher={model: x}", "algorithm.distill.beta=1.5"], "algorithm.distill.beta=1.5"),
    (TINY_RECIPE, ["algorithm.distill.teacher={model: x}", "algorithm.distill.form=loss"], "form='loss' differentiates"),
    (IMAGE_RECIPE, ["algorithm.distill.teacher={tiny_args: {seed: 1}}", "algorithm.distill.divergence=jsd"],
     "divergence='jsd' needs the units' logits"),
])
def test_distillation_recipe_errors_name_the_field(tmp_path, recipe, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        Trainer(parse_config(recipe, [f"output_dir={tmp_path}", *overrides]))


def test_loss_form_closed_form_gradient_against_the_step_means_by_hand(tmp_path):
    """form loss with closed_form (verl-omni's distill_kl): with zero advantages the step's gradient is
    that of w sum_iu a_iu mean_d (mu_s - mu_t)^2 / (2 std^2), the student's step means under grad."""
    t = Trainer(parse_config(IMAGE_RECIPE, [f"output_dir={tmp_path}", "algorithm.distill.teacher={tiny_args: {seed: 1}}",
                                            "algorithm.distill.divergence=closed_form", "algorithm.distill.form=loss",
                                            "algorithm.distill.weight=0.7"]))
    batch = t.prepare_batch(1)
    batch.advantages.zero_()
    up, r = t.updater, batch.rollout
    t.optimizer.zero_grad(set_to_none=True)
    sums = up.accumulate_gradients(batch, up.micro_batches(batch), None, None, False)
    ours = {n: p.grad.clone() for n, p in t.unwrapped.named_parameters() if p.grad is not None}
    t.optimizer.zero_grad(set_to_none=True)
    rows, total, divergence = torch.arange(len(r)), 0.0, 0.0
    for k in range(r.num_units):
        on = r.unit_mask[:, k] * batch.row_mask
        if on.sum() == 0:
            continue
        mu_s, std = t.policy.step_means(t.unwrapped, r, k, rows)
        with torch.no_grad():
            mu_t, _ = t.policy.step_means(t.updater.teachers.modules["teacher"], r, k, rows)
        kl = ((mu_s - mu_t) ** 2 / (2 * std ** 2)).flatten(1).mean(1)
        total = total + 0.7 * (kl * batch.weights[:, k].to(kl.device) * on.to(kl.device)).sum()
        divergence += float((kl.detach() * on.to(kl.device)).sum())
    total.backward()
    assert ours and sums["distill"] == pytest.approx(divergence, rel=1e-4)
    for name, grad in ours.items():
        assert torch.allclose(grad, t.unwrapped.get_parameter(name).grad, rtol=1e-4, atol=1e-8), name


def test_loss_form_jsd_trains_and_is_zero_for_a_teacher_equal_to_the_student(tmp_path):
    same = text_trainer(tmp_path / "same", 0, "algorithm.distill.divergence=jsd", "algorithm.distill.form=loss")
    assert same.train_step()["distill_loss_divergence"] == pytest.approx(0.0, abs=1e-6)
    t = text_trainer(tmp_path / "other", 1, "algorithm.distill.divergence=jsd", "algorithm.distill.form=loss")
    assert t.train_step()["distill_loss_divergence"] > 1e-4


def test_the_text_opd_recipe_trains_a_step(tmp_path):
    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES
    cfg = load_recipe(RECIPES.get("text_opd"), [f"output_dir={tmp_path}", "optim.prompts_per_step=2",
                                                "algorithm.group_size=4", "policy.max_new_tokens=8",
                                                "logging.report_to=[none]", "logging.progress=false"])
    t = Trainer(cfg)
    assert t.updater.teachers.modules["teacher"] is not None and sum(p.numel() for p in t.updater.teachers.modules["teacher"].parameters()) > \
        sum(p.numel() for p in t.unwrapped.parameters())
    assert t.train_step()["distill_divergence"] != 0
