"""The diffusion adapter on tiny random SD3 / FLUX / SD 1.5 pipelines: the ODE path equals the
stock pipeline, exact on-policy log-probs, streamed per-step backward, the LoRA reference, the
step formulas against hand-written references, the trained-step schedule."""

import copy
import math
from pathlib import Path

import pytest
import torch
from helpers import on_policy_step_changes
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.diffusion.samplers import SAMPLERS, gaussian_logprob, gaussian_mean_kl
from mmrl.tasks.diffusion.schedule import StepSchedule

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer

SIZE = 32
FAMILIES = {"sd3": ("tiny:sd3", "flow_sde", True), "flux": ("tiny:flux", "flow_sde", False),
            "sd15": ("tiny:sd15", "ddim", True)}


def make(name, **kw):
    model, sampler, guided = FAMILIES[name]
    args = dict(model=model, height=SIZE, width=SIZE, num_steps=4, eval_num_steps=4, sampler=sampler,
                noise_level=0.7, classifier_free_guidance=guided)
    args.update(kw)
    return DiffusionPolicy(DiffusionConfig(**args))


@pytest.fixture(scope="module")
def policies():
    return {name: make(name) for name in FAMILIES}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_zero_noise_reproduces_the_stock_pipeline(policies, name):
    policy = policies[name]
    policy.cfg.noise_level = 0.0
    try:
        ours = policy.rollout(["red circle"], 2, seeds=[7])
    finally:
        policy.cfg.noise_level = 0.7
    stock = policy.pipe(["red circle"], num_inference_steps=4, height=SIZE, width=SIZE, guidance_scale=4.5,
                        generator=torch.Generator().manual_seed(7), output_type="latent").images
    assert ours.unit_mask.sum() == 0  # no step drew noise: nothing to train
    for row in range(2):  # the group shares its initial noise
        assert torch.allclose(ours.extras["latents"][row, -1], stock[0].float(), atol=1e-5)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_on_policy_ratio_is_exactly_one_and_groups_depend_on_seed_only(policies, name):
    policy = policies[name]
    batch = policy.rollout(["red circle", "blue square"], 2, seeds=[5, 6])
    assert batch.unit_mask[:, :-1].all() and not batch.unit_mask[:, -1].any()  # all but the last
    assert torch.equal(batch.extras["latents"][0, 0], batch.extras["latents"][1, 0])
    assert not torch.equal(batch.extras["latents"][0, 1], batch.extras["latents"][1, 1])
    with torch.no_grad():
        old, _ = policy.logprobs(policy.model, batch)
    new, _ = policy.logprobs(policy.model, batch)
    assert torch.equal(old, new)
    mask = batch.unit_mask.bool()
    assert torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    alone = policy.rollout(["blue square"], 2, seeds=[6])
    assert torch.allclose(alone.extras["latents"], batch.extras["latents"][2:], atol=1e-5)


def test_step_formulas_against_hand_written_references():
    x, v = torch.tensor([[0.5, -1.0]]), torch.tensor([[2.0, 0.25]])
    s, sn, a = 0.8, 0.6, 0.7
    dt = sn - s
    sig = a * math.sqrt(s / (1 - s))
    mean, std = SAMPLERS.get("flow_sde")(x, v, s, sn, a)
    expect = [xi + (vi + sig ** 2 / (2 * s) * (xi + (1 - s) * vi)) * dt for xi, vi in ((0.5, 2.0), (-1.0, 0.25))]
    assert torch.allclose(mean, torch.tensor([expect])) and std == pytest.approx(sig * math.sqrt(-dt))
    _, std_top = SAMPLERS.get("flow_sde")(x, v, 1.0, sn, a)  # s = 1: flow_grpo's sigma_max = s_next
    assert std_top == pytest.approx(a * math.sqrt(1 / (1 - sn)) * math.sqrt(1 - sn))
    mean, std = SAMPLERS.get("dance")(x, v, s, sn, 0.3)
    score = -(x + (1 - s) * v) / s
    assert torch.allclose(mean, x + v * dt - 0.5 * 0.09 * score * dt) and std == pytest.approx(0.3 * math.sqrt(-dt))
    mean, std = SAMPLERS.get("cps")(x, v, s, sn, 0.5)
    std_ref = sn * math.sin(0.25 * math.pi)
    assert torch.allclose(mean, (x - s * v) * (1 - sn) + (x + (1 - s) * v) * math.sqrt(sn ** 2 - std_ref ** 2))
    ode, _ = SAMPLERS.get("ode")(x, v, s, sn, 0.0)
    for name in ("flow_sde", "dance", "cps"):  # strength 0 is the Euler step
        m, sd = SAMPLERS.get(name)(x, v, s, sn, 0.0)
        assert torch.allclose(m, ode) and sd == 0.0
    # log N(y; m, sd^2), mean over dims, by hand
    y, m, sd = torch.tensor([[0.1, 0.3, -0.2]]), torch.tensor([[0.0, 0.5, 0.0]]), 0.4
    by_hand = sum(-(yi - mi) ** 2 / (2 * sd ** 2) - math.log(sd) - 0.5 * math.log(2 * math.pi)
                  for yi, mi in ((0.1, 0.0), (0.3, 0.5), (-0.2, 0.0))) / 3
    assert gaussian_logprob(y, m, sd).item() == pytest.approx(by_hand, rel=1e-6)
    assert gaussian_mean_kl(y, m, sd).item() == pytest.approx((0.01 + 0.04 + 0.04) / (2 * 0.16) / 3, rel=1e-6)
    with pytest.raises(ValueError, match="deterministic"):
        gaussian_logprob(y, m, 0.0)


def test_ddim_step_equals_the_diffusers_scheduler():
    from diffusers import DDIMScheduler
    sched = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False,
                          set_alpha_to_one=False, steps_offset=1)
    sched.set_timesteps(10)
    t = int(sched.timesteps[3])
    g = torch.Generator().manual_seed(0)
    x, eps, z = (torch.randn(1, 4, 4, 4, generator=g) for _ in range(3))
    stock = sched.step(eps, t, x, eta=0.8, variance_noise=z).prev_sample
    ab, ab_next = float(sched.alphas_cumprod[t]), float(sched.alphas_cumprod[t - 100])
    mean, std = SAMPLERS.get("ddim")(x, eps, ab, ab_next, 0.8)
    assert torch.allclose(mean + std * z, stock, atol=1e-5)


def test_lora_reference_equals_the_base_model(policies):
    from peft import LoraConfig, get_peft_model
    policy = make("sd3")
    batch = policy.rollout(["red circle"], 2, seeds=[3])
    base = copy.deepcopy(policy.model)
    lora = get_peft_model(policy.model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    want, _ = policy.logprobs(base, batch)
    with lora.disable_adapter():
        ref, _ = policy.logprobs(lora, batch)
    tuned, _ = policy.logprobs(lora, batch)
    mask = batch.unit_mask.bool()
    assert torch.equal(ref[mask], want[mask]) and not torch.allclose(tuned[mask], want[mask])

    @__import__("contextlib").contextmanager
    def reference():
        with lora.disable_adapter():
            yield lora
    _, _, kl = policy.logprobs_and_kl(lora, reference, batch)
    _, _, kl_zero = policy.logprobs_and_kl(base, lambda: __import__("contextlib").nullcontext(base), batch)
    assert (kl[mask] > 0).all() and torch.equal(kl_zero[mask], torch.zeros_like(kl_zero[mask]))


def test_schedules():
    g = torch.Generator().manual_seed(0)
    assert StepSchedule().trained(5, 0, g).tolist() == [True] * 4 + [False]
    assert StepSchedule("random_fraction", fraction=0.5).trained(9, 0, g).sum() == 4
    draws = {tuple(StepSchedule("random_fraction").trained(9, 0, g).tolist()) for _ in range(5)}
    assert len(draws) > 1  # a different subset per rollout
    win = StepSchedule("window", start=1, size=2)
    assert win.stochastic(6, 0).tolist() == [False, True, True, False, False, False]
    # end="wrap": full windows; the trainer's step k is MixGRPO's iteration k - 1
    slide = StepSchedule("sliding_window", start=0, size=2, stride=1, shift_every=10, end="wrap")
    assert slide.stochastic(6, 10).nonzero().flatten().tolist() == [0, 1]
    assert slide.stochastic(6, 11).nonzero().flatten().tolist() == [1, 2]
    assert slide.stochastic(6, 41).nonzero().flatten().tolist() == [0, 1]  # wraps before the last step
    chunks = StepSchedule("chunks", sizes=[2, 3, 4, 7], sample=1, weights=[1, 0, 0, 0])
    assert chunks.trained(16, 0, g).nonzero().flatten().tolist() == [0, 1]
    assert StepSchedule("chunks", sizes=[2, 2]).trained(4, 0, g).tolist() == [True, True, True, False]
    with pytest.raises(ValueError, match="policy.schedule.kind"):
        StepSchedule("nope")
    with pytest.raises(ValueError, match="sum to the 5 steps"):
        StepSchedule("chunks", sizes=[2, 2]).trained(5, 0, g)


def mixgrpo_windows(sampling_steps, group_size, iters_per_group, overlap_step, iterations):
    """MixGRPO's progressive window with --prog_overlap and --roll_back (its published scripts),
    written out by hand: the trained steps of each training iteration 0, 1, ..."""
    cur, in_group, last, out = 0, 0, sampling_steps - 2, []
    for _ in range(iterations):
        out.append(list(range(cur, min(cur + group_size, last))))
        in_group += 1
        if in_group >= iters_per_group:
            in_group, cur = 0, cur + overlap_step
        if cur > last:
            cur, in_group = 0, 0
    return out


def test_sliding_window_follows_mixgrpo():
    # by hand, 6 steps, window 2, moved every 2 iterations: [0, 1], [1, 2], [2, 3], then cut at
    # step U - 2 = 4: [3], then the empty window, then back to the start
    slide = StepSchedule("sliding_window", size=2, stride=1, shift_every=2)
    got = [slide.stochastic(6, k).nonzero().flatten().tolist() for k in range(1, 13)]
    assert got == [[0, 1]] * 2 + [[1, 2]] * 2 + [[2, 3]] * 2 + [[3]] * 2 + [[]] * 2 + [[0, 1]] * 2
    g = torch.Generator().manual_seed(0)
    assert slide.trained(6, 9, g).tolist() == [False] * 6  # the empty window trains nothing
    # the published run: 25 steps, window 4, moved by 1 every 25 iterations (MixGRPO) or by the
    # window size every 20 (no overlap), over two sweeps and a bit
    refs = {}
    for stride, every in ((1, 25), (4, 20)):
        refs[stride] = ref = mixgrpo_windows(25, 4, every, stride, 1300)
        mine = StepSchedule("sliding_window", size=4, stride=stride, shift_every=every)
        assert [mine.stochastic(25, k + 1).nonzero().flatten().tolist() for k in range(1300)] == ref
    assert [] in refs[1] and [21, 22] in refs[1] and not any(23 in w for w in refs[1])
    assert [] not in refs[4] and [20, 21, 22] in refs[4]
    with pytest.raises(ValueError, match="policy.schedule.end"):
        StepSchedule("sliding_window", end="bounce")
    with pytest.raises(ValueError, match="policy.schedule.start=5"):
        StepSchedule("sliding_window", start=5).stochastic(6, 1)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="policy.sampler='ddim'"):
        make("sd3", sampler="ddim")
    with pytest.raises(ValueError, match="policy.classifier_free_guidance"):
        make("flux", classifier_free_guidance=True)


RECIPE = {
    "task": "diffusion",
    "policy": {"model": "tiny:sd3", "height": SIZE, "width": SIZE, "num_steps": 4, "eval_num_steps": 4,
               "noise_level": 0.7},
    "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": SIZE}},
    "rewards": {"mean_red": {"weight": 1.0}},
    "reward_modules": [str(Path(__file__).parent / "image_reward.py")],
    "algorithm": {"group_size": 3, "eps_low": 1e-3, "eps_high": 1e-3},
    "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 6},
    "logging": {"report_to": ["none"], "progress": False},
    "max_steps": 1,
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_streamed_steps_equal_one_backward_and_a_training_step(tmp_path, monkeypatch, name):
    model, sampler, guided = FAMILIES[name]
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", f"policy.model={model}", f"policy.sampler={sampler}",
                                      f"policy.classifier_free_guidance={str(guided).lower()}"]))
    batch = t.prepare_batch(1)
    assert (batch.advantages != 0).any()
    grads = []
    for size, whole in ((6, False), (2, False), (6, True)):
        t.cfg.optim.micro_batch_size = size
        if whole:  # one backward over all trained steps at once
            monkeypatch.setattr(t.policy, "unit_slices", lambda mb: [slice(None)])
        t.optimizer.zero_grad(set_to_none=True)
        t.updater.accumulate_gradients(batch, t.updater.micro_batches(batch), None, None, with_entropy=False)
        grads.append({n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None})
    assert grads[0]
    for other in grads[1:]:
        assert other.keys() == grads[0].keys()
        for name in grads[0]:
            assert torch.allclose(grads[0][name], other[name], atol=1e-6, rtol=1e-4), name
    monkeypatch.undo()
    assert on_policy_step_changes(t)


@pytest.mark.slow  # 38 s in the default run on 2 cores beside two demos (2026-11-29); the default run stays under 15 min
def test_lora_training_with_the_closed_form_kl(tmp_path):
    overrides = [f"output_dir={tmp_path}", "optim.lora.r=4", "algorithm.beta=0.04",
                 "algorithm.kl_estimator=closed_form", "algorithm.mu=2", "max_steps=2"]
    t = Trainer(parse_config(RECIPE, overrides))
    first = t.train_step()
    assert first["kl"] == 0.0 and first["ratio_max_dev"] == 0.0  # LoRA B starts at 0: policy = reference
    second = t.train_step()
    assert second["kl"] > 0.0


def test_turning_points_on_hand_made_trajectories():
    from mmrl.tasks.diffusion.turning_point import step_rewards
    # R_0..R_4; trend D = +0.4. d = [-0.1, +0.3, -0.2, +0.4]
    scores = torch.tensor([[0.5, 0.4, 0.7, 0.5, 0.9]], dtype=torch.float64)
    rewards, tp = step_rewards(scores, consistent_steps="first")
    # step 0: d_0 = -0.1 against R_4 - R_1 = +0.5: no; step 1 flips - to +: yes; step 2: no; step 3 flips: yes
    assert tp.tolist() == [[False, True, False, True]]
    assert torch.allclose(rewards, torch.tensor([[-0.1, 0.9 - 0.4, -0.2, 0.9 - 0.5]], dtype=torch.float64))
    # the authors' run also asks steps >= 1 to be consistent: step 3 reaches R_W itself (R_W - R_4 = 0)
    rewards, tp = step_rewards(scores)
    assert tp.tolist() == [[False, True, False, False]]
    assert torch.allclose(rewards, torch.tensor([[-0.1, 0.9 - 0.4, -0.2, 0.4]], dtype=torch.float64))
    # a monotone trajectory has no turning point but its first step (consistent with the rest)
    rewards, tp = step_rewards(torch.tensor([[0.0, 0.1, 0.3, 0.6]], dtype=torch.float64))
    assert tp.tolist() == [[True, False, False]]
    assert torch.allclose(rewards, torch.tensor([[0.6, 0.2, 0.3]], dtype=torch.float64))
    # falling trend: the sign test is relative to D
    _, tp = step_rewards(torch.tensor([[1.0, 1.2, 0.8, 0.5]], dtype=torch.float64))
    assert tp.tolist() == [[False, True, False]]


def test_turning_point_rewards_reach_the_step_estimator(tmp_path):
    recipe = copy.deepcopy(RECIPE)
    recipe["policy"].update({"turning_points": True, "schedule": {"kind": "window", "start": 1, "size": 2},
                             "tp_max_extra_passes": 40})
    recipe["algorithm"]["estimator"] = "step"
    t = Trainer(parse_config(recipe, [f"output_dir={tmp_path}"]))
    batch = t.prepare_batch(1)
    assert batch.advantages.shape == (6, 4)
    assert (batch.advantages[:, [0, 3]] == 0).all()
    # states 1, 2 complete with 3 and 2 ODE steps (x CFG 2); state 3 is followed by ODE only
    assert batch.metrics["policy/tp_extra_denoiser_calls"] == 6 * 2 * (3 + 2)
    metrics = t.train_step()
    assert metrics["ratio_max_dev"] == 0.0
    assert t.policy.training_step == 1  # the trainer tells the policy (sliding windows move with it)
    t.policy.cfg.tp_max_extra_passes = 4
    with pytest.raises(ValueError, match="policy.tp_max_extra_passes=4"):
        t.prepare_batch(2)


def test_chunks_from_the_relative_l1_change_and_chunk_ratios(tmp_path):
    from mmrl.tasks.diffusion.chunks import calibrate_chunks, chunk_sizes, relative_l1_change

    from mmrl.core.objectives import grouped_log_ratio
    # a hand-made trajectory: x_k = 1, 2, 4, 5, 6 (one latent dim): changes 1, 1, 0.25, 0.2
    traj = torch.tensor([[1.0, 2.0, 4.0, 5.0, 6.0]])[..., None]
    change = relative_l1_change(traj)
    assert torch.allclose(change, torch.tensor([1.0, 1.0, 0.25, 0.2]))
    # cumulative share 0.41, 0.82, 0.92, 1: half is reached at step 1
    assert chunk_sizes(change, 2) == [2, 2] and chunk_sizes(change, 3) == [1, 1, 2]
    assert chunk_sizes(torch.ones(16), 4) == [4, 4, 4, 4]
    with pytest.raises(ValueError, match="num_chunks=5"):
        chunk_sizes(change, 5)
    # one ratio per chunk: the masked mean of the log-ratios of its steps
    lr = torch.tensor([[0.1, 0.3, -0.2, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    grouped = grouped_log_ratio(lr, mask, "chunk", [slice(0, 2), slice(2, 4)])
    assert torch.allclose(grouped, torch.tensor([[0.2, 0.2, -0.2, -0.2]]))
    policy = make("sd3")
    assert sum(calibrate_chunks(policy, ["red circle"], 2, group_size=2)) == 4
    # the trainer backpropagates chunk by chunk; a second pass sees ratios != 1
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", "algorithm.ratio_level=chunk",
                                      "algorithm.chunks=[2,2]", "algorithm.mu=2"]))
    assert [s for s, _ in t.updater.unit_slices(t.prepare_batch(1).rollout)] == [slice(0, 2), slice(2, 4)]
    assert t.train_step()["ratio_max_dev"] == 0.0


@pytest.mark.parametrize("recipe", ["t2i_flowgrpo", "t2i_dancegrpo", "t2i_chunk", "t2i_turning_point", "t2i_nft",
                                    "t2i_flowgrpo_fast", "t2i_grpo_guard", "t2i_flowdppo", "t2i_pref_grpo",
                                    "t2v_demo"])
def test_recipes_run_a_step(recipe, tmp_path):
    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES
    cfg = load_recipe(RECIPES.get(recipe), [f"output_dir={tmp_path}", "algorithm.group_size=2",
                                           "optim.prompts_per_step=1", "max_steps=1", "logging.progress=false",
                                           "logging.report_to=[none]"])
    metrics = Trainer(cfg).train_step()
    assert metrics["ratio_max_dev"] == 0.0 and math.isfinite(metrics["loss"])


def test_warm_start_loss_is_the_flow_matching_loss():
    import numpy as np
    from mmrl.tasks.demos.synthetic.colour_shapes import colour_shapes
    policy = DiffusionPolicy(DiffusionConfig(model="tiny:pixel-flow", height=16, width=16, num_steps=4, classifier_free_guidance=False,
                                             cfg_dropout=0.0, sampler="dance", noise_level=0.3))
    rows = colour_shapes(n_train=3, n_eval=0, size=16)["train"]
    torch.manual_seed(0)
    loss = policy.supervised_loss(policy.model, rows, "image")
    torch.manual_seed(0)
    x0 = torch.stack([torch.from_numpy(np.asarray(r["image"], dtype=np.float32)).permute(2, 0, 1) / 127.5 - 1
                      for r in rows])
    torch.rand(3)  # the prompt-dropout draw
    eps = torch.randn_like(x0)
    s = torch.rand(3)
    x = (1 - s.view(-1, 1, 1, 1)) * x0 + s.view(-1, 1, 1, 1) * eps
    cond = policy.family.encode([r["prompt"] for r in rows], False)
    with torch.no_grad():
        pred = policy.model(hidden_states=x, timestep=s * 1000, encoder_hidden_states=cond["pos/embeds"],
                            pooled_projections=cond["pos/pooled"], return_dict=False)[0]
    assert loss.item() == pytest.approx(torch.nn.functional.mse_loss(pred, eps - x0).item(), rel=1e-5)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.model.parameters())
    for name in FAMILIES:  # the VAE families encode the target images to latents first
        other = make(name)
        other.supervised_loss(other.model, rows, "image").backward()
        with pytest.raises(KeyError, match="'missing'"):
            other.supervised_loss(other.model, rows, "missing")



@pytest.mark.parametrize("model", ["tiny:pixel-flow", "tiny:pixel-flow-unet"])
def test_pixel_pipelines_roll_out_on_policy_and_load_back_from_their_directory(model, tmp_path):
    """The demo's pixel-space pipelines (an MMDiT or a UNet denoiser): the sampler's log-probs are
    the training forward's, a group's images depend on its seed only, the warm start's flow
    loss trains the denoiser, and a saved pipeline loads back as `policy.model: path`."""
    from mmrl.tasks.demos.synthetic.colour_shapes import colour_shapes
    from mmrl.tasks.diffusion.loading import load_pipeline
    cfg = dict(height=16, width=16, num_steps=4, eval_num_steps=4, classifier_free_guidance=False, cfg_dropout=0.0,
               sampler="dance", noise_level=0.3)
    policy = DiffusionPolicy(DiffusionConfig(model=model, **cfg))
    batch = policy.rollout(["red circle", "blue square"], 2, seeds=[5, 6])
    mask = batch.unit_mask.bool()
    logp, _ = policy.logprobs(policy.model, batch)
    assert mask.any() and torch.allclose(logp[mask], batch.rollout_logp[mask], atol=1e-5)
    alone = policy.rollout(["blue square"], 2, seeds=[6])
    assert torch.allclose(alone.extras["latents"], batch.extras["latents"][2:], atol=1e-5)
    rows = colour_shapes(n_train=4, n_eval=0, size=16)["train"]
    policy.supervised_loss(policy.model, rows, "image").backward()
    torch.optim.SGD(policy.model.parameters(), lr=0.1).step()
    policy.save_pretrained(policy.model, tmp_path)
    loaded = load_pipeline(DiffusionConfig(model=str(tmp_path), **cfg))
    assert type(loaded) is type(policy.pipe)
    trained = dict(policy.model.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in policy.family.__class__(loaded, (16, 16)).denoiser.named_parameters())
    fresh = DiffusionPolicy(DiffusionConfig(model=model, **cfg)).model
    assert not all(torch.equal(p, q) for p, q in zip(fresh.parameters(), policy.model.parameters()))

def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for checkpointing in (False, True):
        policy = make("sd3", gradient_checkpointing=checkpointing)
        assert policy.model.gradient_checkpointing is checkpointing
        batch = policy.rollout(["red circle"], 2, seeds=[4])
        logp, _ = policy.logprobs(policy.model, batch, slice(0, 2))
        logp.sum().backward()
        grads.append({n: p.grad for n, p in policy.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


NFT = ["policy.units=forward_process", "policy.sampler=ode", "policy.classifier_free_guidance=false",
       "algorithm.objective=nft", "algorithm.beta=1e-4", "algorithm.kl_estimator=closed_form"]


@pytest.mark.parametrize("model", ["tiny:sd3", "tiny:flux", "tiny:pixel-flow", "tiny:pixel-flow-unet"])
def test_nft_trains_every_flow_family_on_its_forward_process(model, tmp_path):
    """DiffusionNFT's units on each flow family: unit k re-noises the final sample at level k, and
    a step moves the denoiser."""
    size = 16 if model.startswith("tiny:pixel") else SIZE  # the pixel demos' small position table
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", f"policy.model={model}", f"policy.height={size}",
                                      f"policy.width={size}", *NFT]))
    batch = t.policy.rollout(t.inputs.train_rows[:1], 3, seeds=[5])
    assert batch.extras["clean"].shape[0] == 3 and not torch.equal(batch.extras["clean"][0], batch.extras["clean"][1])
    assert batch.unit_mask.sum(1).tolist() == [3.0, 3.0, 3.0]  # int(4 x 0.99) of the 4 levels
    before = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    metrics = t.train_step()
    assert math.isfinite(metrics["loss"])
    assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters() if p.requires_grad)


def test_nft_recipe_errors_name_the_field(tmp_path):
    from mmrl.config.parse import ConfigError
    cases = [(["algorithm.objective=nft"], "policy.units: forward_process"),
             (["policy.units=forward_process", "policy.classifier_free_guidance=false"], "takes logprobs"),
             ([*NFT, "algorithm.mu=2"], "algorithm.mu=2"),
             ([*NFT, "algorithm.kl_estimator=k3"], "algorithm.kl_estimator='k3'"),
             ([*NFT, "algorithm.entropy_coef=0.1"], "algorithm.entropy_coef=0.1")]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", *overrides]))
    with pytest.raises(ValueError, match="policy.units=forward_process trains the CFG-free model"):
        make("sd3", units="forward_process")
    with pytest.raises(ValueError, match="predicts eps"):
        make("sd15", units="forward_process", classifier_free_guidance=False)


def test_random_window_draws_flow_grpo_fasts_start():
    """Flow-GRPO-Fast: the window's start uniform in range[0] .. range[1] - size (inclusive),
    the default range [0, U // 2)."""
    fast = StepSchedule("random_window", size=3)
    starts = [fast.random_window(10, torch.Generator().manual_seed(s))[0] for s in range(400)]
    assert set(starts) == {0, 1, 2}  # 10 // 2 - 3 = 2
    assert all(abs(starts.count(v) / 400 - 1 / 3) < 0.08 for v in range(3))
    ranged = StepSchedule("random_window", size=2, window_range=[3, 7])
    assert {ranged.random_window(10, torch.Generator().manual_seed(s))[0] for s in range(200)} == {3, 4, 5}
    on = ranged.stochastic(10, 1, torch.Generator().manual_seed(0))
    first = int(on.nonzero()[0])
    assert on.tolist() == [first <= k < first + 2 for k in range(10)]
    with pytest.raises(ValueError, match="window_range"):
        StepSchedule("random_window", window_range=[4, 2])
    with pytest.raises(ValueError, match="window of size 6"):
        StepSchedule("random_window", size=6).random_window(10, torch.Generator())


def test_random_window_rollouts_take_the_sde_only_in_their_groups_window():
    """Each group draws its window; its rows take the SDE there (and train those steps) and the
    ODE step x + dt v elsewhere, recomputed here with the model."""
    policy = make("sd3", num_steps=6, schedule=StepSchedule("random_window", size=2, window_range=[0, 5]))
    seeds = list(range(1, 7))
    batch = policy.rollout(["red circle"] * 6, 2, seeds=seeds)
    noisy, latents, levels = batch.extras["stochastic"], batch.extras["latents"], batch.extras["levels"][0].tolist()
    windows = set()
    for g in range(6):
        rows = noisy[2 * g: 2 * g + 2]
        assert torch.equal(rows[0], rows[1]) and rows[0].sum() == 2
        first = int(rows[0].nonzero()[0])
        assert rows[0].tolist() == [first <= k < first + 2 for k in range(6)]
        windows.add(first)
    assert len(windows) > 1  # groups draw windows of their own
    assert torch.equal(batch.unit_mask.bool(), noisy)
    assert ((batch.rollout_logp != 0) == noisy).all()
    cond = {k: v for k, v in batch.extras.items() if k.startswith(("pos/", "neg/"))}
    with torch.no_grad():
        for k in range(6):
            v = policy.family.predict(policy.model, latents[:, k], batch.extras["timesteps"][0, k], cond,
                                      policy.cfg.guidance_scale, True).float()
            ode = latents[:, k] + (levels[k + 1] - levels[k]) * v
            off = ~noisy[:, k]
            assert torch.allclose(latents[off, k + 1], ode[off], atol=1e-5), k
            if (~off).any():  # the SDE rows drew noise
                assert (latents[~off, k + 1] - ode[~off]).abs().max() > 1e-3, k
    with pytest.raises(ValueError, match="random_window draws one per group"):
        make("sd3", turning_points=True, schedule=StepSchedule("random_window"))


def test_grpo_guard_step_scales_and_a_step(tmp_path):
    """GRPO-Guard's scales of a flow_sde step, a = 0.7 sqrt(s / (1 - s)) sqrt(|dt|) and 1 / |dt| by hand
    (s = 1 takes s_next in the ratio), a training step under them, and the recipe errors."""
    from mmrl.config.parse import ConfigError
    from mmrl.tasks.diffusion.grpo_guard import guard_step_scales
    std, inv = guard_step_scales("flow_sde", 0.8, 0.5, 0.7)
    assert math.isclose(std, 0.7 * math.sqrt(0.8 / 0.2) * math.sqrt(0.3)) and math.isclose(inv, 1 / 0.3)
    assert math.isclose(guard_step_scales("flow_sde", 1.0, 0.75, 0.7)[0], 0.7 * math.sqrt(1 / 0.25) * math.sqrt(0.25))
    assert math.isclose(guard_step_scales("dance", 0.8, 0.5, 0.3)[0], 0.3 * math.sqrt(0.3))
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", "algorithm.ratio_norm=grpo_guard"]))
    batch = t.prepare_batch(1).rollout
    ratio_scale, loss_scale = t.policy.step_scales(batch, slice(0, 2))
    levels = batch.extras["levels"][0].tolist()
    assert torch.allclose(loss_scale[:, 1], torch.full((len(batch),), 1 / (levels[1] - levels[2])))
    assert math.isclose(float(ratio_scale[0, 1]), guard_step_scales("flow_sde", levels[1], levels[2], 0.7)[0], rel_tol=1e-6)
    metrics = t.train_step()
    assert metrics["ratio_max_dev"] == 0.0 and math.isfinite(metrics["loss"])
    for overrides, message in [(["policy.sampler=cps"], "policy.sampler='cps'"), (["algorithm.mu=2"], "algorithm.mu: 1"),
                               (["algorithm.ratio_level=sequence"], "ratio_level: unit")]:
        with pytest.raises(ConfigError, match=message):
            Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", "algorithm.ratio_norm=grpo_guard", *overrides]))


@pytest.mark.parametrize("model", ["tiny:flux", "tiny:pixel-flow-unet"])
def test_fast_windows_and_grpo_guard_train_other_flow_families(model, tmp_path):
    """Flow-GRPO-Fast's random window and GRPO-Guard's scales together on FLUX and a pixel UNet:
    only each group's window is trained, and a step is on-policy and moves the denoiser."""
    size = 16 if model.startswith("tiny:pixel") else SIZE
    t = Trainer(parse_config(RECIPE, [f"output_dir={tmp_path}", f"policy.model={model}", f"policy.height={size}",
                                      f"policy.width={size}", "policy.classifier_free_guidance=false",
                                      "policy.num_steps=6", "policy.schedule.kind=random_window",
                                      "algorithm.ratio_norm=grpo_guard"]))
    batch = t.policy.rollout(t.inputs.train_rows[:2], 3, seeds=[1, 2])
    assert torch.equal(batch.unit_mask.bool(), batch.extras["stochastic"]) and (batch.unit_mask.sum(1) == 2).all()
    assert on_policy_step_changes(t, rollout_atol=1e-4)
