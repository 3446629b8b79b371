"""FlowDPPO (`algorithm.trust_region: dppo`) against a hand transcription of its authors' code
(Tencent-Hunyuan/UniRL: `unirl/algorithms/flowdppo.py` `_flowdppo_kl_adv_loss`, `base.py`
`_gaussian_kl_div`, `unirl/sde/kernels.py` the Flow / Dance / CPS steps and `transition_std`), and
the old step means kept from before the first update pass."""

import copy
import math

import pytest
import torch
from helpers import TINY_IMAGE_RECIPE
from mmrl.tasks.diffusion.samplers import SAMPLERS, gaussian_logprob, gaussian_mean_kl

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.config.parse import ConfigError, parse_config
from mmrl.core.objectives import AGGREGATIONS, policy_loss
from mmrl.train.loop.trainer import Trainer

# ----- the authors' functions, transcribed (tensors [B, S, D]; sigma per step) -----------------------


def authors_std_dev_t(kind: str, sigma, sigma_next, eta: float, sigma_max: float):
    if kind == "flow":
        return torch.sqrt(sigma / (1 - torch.where(sigma == 1, torch.tensor(sigma_max), sigma))) * eta
    if kind == "dance":
        return torch.full_like(sigma, float(eta))
    return sigma_next * math.sin(eta * math.pi / 2)  # cps


def authors_step(kind: str, noise_pred, sample, sigma, sigma_next, eta: float, sigma_max: float):
    """(prev_sample_mean, std_var) of FlowSDEStrategy / DanceSDEStrategy / CPSSDEStrategy.step."""
    std_dev_t = authors_std_dev_t(kind, sigma, sigma_next, eta, sigma_max)
    if kind == "cps":
        pred_original = sample - sigma * noise_pred
        noise_estimate = sample + noise_pred * (1 - sigma)
        mean = pred_original * (1 - sigma_next) + noise_estimate * torch.sqrt(sigma_next ** 2 - std_dev_t ** 2)
        return mean, std_dev_t
    dt = sigma_next - sigma
    mean = (sample * (1 + std_dev_t ** 2 / (2 * sigma) * dt)
            + noise_pred * (1 + std_dev_t ** 2 * (1 - sigma) / (2 * sigma)) * dt)
    return mean, std_dev_t * torch.sqrt(-dt)


def authors_logprob(prev_sample, mean, std_var):
    lp = -((prev_sample.detach() - mean) ** 2) / (2 * std_var ** 2) - torch.log(std_var) - 0.5 * math.log(2 * math.pi)
    return lp.mean(dim=tuple(range(1, lp.ndim)))


def authors_kl_adv_loss(new_logp, old_logp, new_means, old_means, advantages, sigma_t, kl_mask_threshold):
    ratio = torch.exp(new_logp - old_logp)
    adv = advantages.detach()
    unclipped_loss = -adv * ratio
    kl_per_elem = (new_means - old_means) ** 2 / (2 * sigma_t ** 2)
    kl_per_sample = kl_per_elem.mean(dim=tuple(range(2, kl_per_elem.ndim)))
    kl_mask = kl_per_sample < kl_mask_threshold
    pos_rm_mask = (~kl_mask) & (ratio > 1.0) & (adv > 0)
    neg_rm_mask = (~kl_mask) & (ratio < 1.0) & (adv < 0)
    keep_adv_mask = (~(pos_rm_mask | neg_rm_mask)).detach()
    loss = torch.where(keep_adv_mask, unclipped_loss, torch.zeros(()))
    return loss.mean(), int((pos_rm_mask | neg_rm_mask).sum())  # their masked_fraction x units


# ----- the comparison ---------------------------------------------------------------------------------

SAMPLER_OF = {"flow": "flow_sde", "dance": "dance", "cps": "cps"}


def one_case(kind: str, threshold: float, gen: torch.Generator, b: int = 4, d: int = 24):
    """The authors' loss and mmrl's on the same latents, velocities, samples and advantages over
    the SDE steps of a 10-step schedule (sigma_max = sigmas[1], as their `_transition_sigma`)."""
    sigmas = torch.linspace(1.0, 0.0, 11).tolist()
    eta = 0.7 if kind != "dance" else 0.3
    steps = [0, 2, 4]  # the first half, as their AllSDEScheduler(timestep_fraction [0, 0.5], 3 steps)
    x = torch.randn(b, len(steps), d, generator=gen)
    v_old = torch.randn(b, len(steps), d, generator=gen)
    scale = 10 ** (-4 + 3 * torch.rand(b, len(steps), 1, generator=gen))
    delta = torch.randn(b, len(steps), d, generator=gen) * scale
    adv = torch.randn(b, generator=gen)
    noise = torch.randn(b, len(steps), d, generator=gen)
    # the authors
    v_new_a = (v_old + delta).requires_grad_(True)
    s = torch.tensor([sigmas[k] for k in steps]).view(1, -1, 1)
    s_next = torch.tensor([sigmas[k + 1] for k in steps]).view(1, -1, 1)
    old_mean_a, std_var = authors_step(kind, v_old, x, s, s_next, eta, sigmas[1])
    new_mean_a, _ = authors_step(kind, v_new_a, x, s, s_next, eta, sigmas[1])
    sample = old_mean_a + std_var * noise
    new_lp = torch.stack([authors_logprob(sample[:, j], new_mean_a[:, j], std_var[:, j]) for j in range(len(steps))], 1)
    old_lp = torch.stack([authors_logprob(sample[:, j], old_mean_a[:, j], std_var[:, j]) for j in range(len(steps))], 1)
    theirs, their_held = authors_kl_adv_loss(new_lp, old_lp, new_mean_a, old_mean_a, adv[:, None].expand_as(new_lp),
                                             std_var, threshold)
    theirs.backward()
    # mmrl
    v_new = (v_old + delta).requires_grad_(True)
    step = SAMPLERS.get(SAMPLER_OF[kind])
    logps, olds, divs = [], [], []
    for j, k in enumerate(steps):
        old_mean, std = step(x[:, j], v_old[:, j], sigmas[k], sigmas[k + 1], eta)
        mean, _ = step(x[:, j], v_new[:, j], sigmas[k], sigmas[k + 1], eta)
        logps.append(gaussian_logprob(sample[:, j], mean, std))
        olds.append(gaussian_logprob(sample[:, j], old_mean, std))
        divs.append(gaussian_mean_kl(old_mean, mean, std))
    cfg = AlgorithmConfig(trust_region="dppo", dppo_threshold=threshold)
    mask = torch.ones(b, len(steps))
    weights = AGGREGATIONS.get("token_mean")(mask, float(mask.sum()), float(b), len(steps))
    ours = policy_loss(torch.stack(logps, 1), torch.stack(olds, 1).detach(), adv, mask, weights, cfg,
                       divergence=torch.stack(divs, 1).detach())
    ours.loss.backward()
    return theirs.item(), ours.loss.item(), v_new_a.grad, v_new.grad, their_held, ours.clipped


def test_flow_dppo_matches_the_authors_loss_and_gradient():
    """3 samplers x 3 thresholds x 20 batches of 4 samples x 3 SDE steps: the same loss, the same
    gradient in the velocity, the same units masked; the masks are exercised (some units held,
    some kept), so the test fails if the mask's direction, threshold or KL normalisation differs."""
    gen = torch.Generator().manual_seed(0)
    cases, held, largest_loss, largest_grad = 0, 0, 0.0, 0.0
    for kind in ("flow", "dance", "cps"):
        for threshold in (1e-5, 1e-3, 1e-1):
            for _ in range(20):
                theirs, ours, g_theirs, g_ours, their_held, our_held = one_case(kind, threshold, gen)
                assert their_held == our_held
                largest_loss = max(largest_loss, abs(theirs - ours))  # losses of order 1, in float32
                largest_grad = max(largest_grad, float((g_theirs - g_ours).abs().max() / g_theirs.abs().max().clamp(min=1e-12)))
                cases, held = cases + 1, held + our_held
    assert cases == 180 and 0 < held < 180 * 12
    assert largest_loss < 1e-6 and largest_grad < 1e-5, (largest_loss, largest_grad)  # 2.4e-7, 1.3e-6


def test_the_mask_by_hand():
    """A unit is held exactly when its divergence reaches the threshold and its ratio moves with
    the advantage; a far unit moving back keeps -A rho and its gradient."""
    cfg = AlgorithmConfig(trust_region="dppo", dppo_threshold=0.5)
    logp = torch.tensor([[0.2, -0.2, 0.2, 0.1]], requires_grad=True)
    old = torch.zeros(1, 4)
    div = torch.tensor([[1.0, 1.0, 0.1, 0.5]])
    mask = torch.ones(1, 4)
    terms = policy_loss(logp, old, torch.tensor([2.0]), mask, mask / 4, cfg, divergence=div)
    # units: far and pushed (held), far and moving back (kept), near (kept), at the threshold and pushed (held)
    expected = (-2 * math.exp(-0.2) - 2 * math.exp(0.2)) / 4
    assert math.isclose(terms.loss.item(), expected, rel_tol=1e-6) and terms.clipped == 2
    terms.loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -2 * math.exp(-0.2) / 4, -2 * math.exp(0.2) / 4, 0.0]]))


RECIPE = {**TINY_IMAGE_RECIPE, "algorithm": {"group_size": 3, "trust_region": "dppo", "mu": 2, "dppo_threshold": 1e-9}}


def test_old_step_means_are_kept_across_passes(tmp_path):
    """The step means of the policy before the first pass are kept: after one optimizer step the
    second pass holds exactly the units an independent count finds from those means (the KL of
    the step Gaussians, by hand, >= threshold, and the ratio moving with the advantage), while
    means recomputed from the current policy would hold none."""
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}"]))
    batch = t.prepare_batch(1)
    up, rollout = t.updater, batch.rollout
    before = copy.deepcopy(t.unwrapped)
    chunks = up.micro_batches(batch)
    old_logp, old_means = up.old_logprobs_and_means(batch, chunks)
    with torch.no_grad():  # the pre-update means, from an independent copy and the step function
        ks, every_row = range(rollout.num_units), torch.arange(len(rollout))
        first = torch.stack([t.policy.step_means(before, rollout, k, every_row)[0].cpu() for k in ks], 1)
    unit = rollout.unit_mask.bool()
    assert torch.allclose(old_means[unit], first[unit], atol=1e-6)
    t.optimizer.zero_grad(set_to_none=True)
    assert up.accumulate_gradients(batch, chunks, old_logp, None, False, old_means)["clipped"] == 0
    up.strategy.step(up.model, up.optimizer, [p for p in up.model.parameters() if p.requires_grad])
    t.optimizer.zero_grad(set_to_none=True)
    second = up.accumulate_gradients(batch, chunks, old_logp, None, False, old_means)
    with torch.no_grad():
        expected = 0
        logp = t.policy.logprobs(t.model, rollout)[0].cpu()
        for k in ks:
            mean, std = t.policy.step_means(t.model, rollout, k, every_row)
            kl = ((mean.cpu() - first[:, k]) ** 2 / (2 * std ** 2)).flatten(1).mean(1)
            ratio = (logp[:, k] - old_logp[:, k]).exp()
            adv = batch.advantages
            pushed = ((ratio > 1) & (adv > 0)) | ((ratio < 1) & (adv < 0))
            expected += int(((kl >= 1e-9) & pushed & unit[:, k] & (batch.row_mask > 0)).sum())
    assert expected > 0 and second["clipped"] == expected
    t.optimizer.zero_grad(set_to_none=True)
    assert up.accumulate_gradients(batch, chunks, old_logp, None, False, None)["clipped"] == 0


@pytest.mark.parametrize("model,sampler", [("tiny:flux", "flow_sde"), ("tiny:sd15", "ddim"),
                                           ("tiny:pixel-flow-unet", "cps")])
def test_dppo_trains_other_families_and_samplers(model, sampler, tmp_path):
    size = 16 if model.startswith("tiny:pixel") else 32
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", f"policy.model={model}", f"policy.sampler={sampler}",
                                      f"policy.height={size}", f"policy.width={size}",
                                      "policy.classifier_free_guidance=false"]))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    metrics = t.train_step()
    assert metrics["ratio_max_dev"] == 0.0 and metrics["clip_frac"] == 0.0 and math.isfinite(metrics["loss"])
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.mu=1"], "needs algorithm.mu >= 2"),
    (["algorithm.ratio_norm=grpo_guard"], "ratio_norm='grpo_guard'"),
    (["algorithm.ratio_level=sequence"], "ratio_level='sequence'"),
    (["algorithm.dppo_threshold=0"], "algorithm.dppo_threshold=0"),
    (["policy.units=forward_process", "policy.sampler=ode", "algorithm.objective=nft"], "policy.units: steps"),
])
def test_dppo_recipe_errors_name_the_field(overrides, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", *overrides]))


def test_dppo_trains_a_video_family(tmp_path):
    """Text-to-video (tiny Wan 2.1): the old means are the latent video's [N, U, C, F, H, W] step
    means, and a two-pass step runs and moves the denoiser."""
    t = Trainer(parse_config({**RECIPE, "rewards": {"colour_shape": {"weight": 1.0, "args": {"frames": "all"}}},
                              "reward_modules": []},
                             [f"output_dir={tmp_path}", "policy.model=tiny:wan-t2v", "policy.num_frames=5",
                              "policy.num_steps=3", "policy.eval_num_steps=3"]))
    batch = t.prepare_batch(1)
    _, old_means = t.updater.old_logprobs_and_means(batch, t.updater.micro_batches(batch))
    assert old_means.shape[:2] == batch.rollout.unit_mask.shape
    assert old_means.shape[2:] == batch.rollout.extras["latents"].shape[2:] and old_means.dim() == 6
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    metrics = t.train_step()
    assert metrics["ratio_max_dev"] == 0.0 and math.isfinite(metrics["loss"])
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())
