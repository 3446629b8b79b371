"""The authors' conventions offered as options, each against a small hand-written reference of the
authors' rule as their code computes it: TP-GRPO's turning points and balanced bonus
(YunzeTong/TurningPoint-GRPO), Flow-GRPO's KL (yifan123/flow_grpo train_sd3.py), Flow-GRPO's CPS
log-prob, the d1 preset (dllm-reasoning/d1 diffu-grpo), and the per-prompt reward normalisation of
DiffusionNFT's and Flow-GRPO's stat tracker (numpy's population std)."""

import math
import random

import pytest
import torch
from mmrl.tasks.diffusion.samplers import (
    SAMPLERS,
    cps_authors_logprob,
    flow_grpo_kl_factor,
    gaussian_logprob,
    gaussian_mean_kl,
)
from mmrl.tasks.diffusion.turning_point import step_rewards

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.config.parse import load_recipe
from mmrl.core.advantages import compute_advantages, std_ddof
from mmrl.registry import RECIPES


def _sign(x: float) -> float:
    return (x > 0) - (x < 0)


def authors_op3(rows: list[list[float]], eta: float = 1.0, inter_consistent: bool = True,
                balanced: bool = False) -> list[list[float]]:
    """The op3 reward pass of my_train_sd3_fast_with_op3.py, flags of common_op3.sh
    (apply_first_step_bonus, use_delta_global, select_first_step_only_from_consistent_trajectory,
    use_sde_minus_rt, drop_original_reward_when_having_bonus; take_delta_global_as_main and
    propagate_bonus_to_future_steps off), one sample batch, scalar loops. reward_sequence is
    [R_ode, R_1, ..., R_W] with R_W = the SDE image's reward."""
    n, w = len(rows), len(rows[0]) - 1
    sde = [r[-1] for r in rows]
    delta_global = [r[-1] - r[0] for r in rows]
    d = [[r[t + 1] - r[t] for t in range(w)] for r in rows]
    s = [[_sign(d[b][t]) * _sign(delta_global[b]) for t in range(w)] for b in range(n)]
    ind = [[0.0] * w for _ in range(n)]
    for b in range(n):
        for t in range(w):
            if t == 0:
                ind[b][t] = float(_sign(d[b][0]) * _sign(sde[b] - rows[b][1]) > 0)
            else:
                ind[b][t] = float(s[b][t - 1] < 0) * float(s[b][t] > 0)
                if inter_consistent:
                    ind[b][t] *= float(_sign(d[b][t]) * _sign(sde[b] - rows[b][t + 1]) > 0)
    if balanced:  # B_t candidates are delta_global (use_delta_global, not take_delta_global_as_main)
        flat = [(b * w + t, delta_global[b]) for b in range(n) for t in range(w) if ind[b][t] > 0]
        pos = [(i, v) for i, v in flat if v > 0]
        neg = [(i, v) for i, v in flat if v < 0]
        if pos and neg:
            keep = min(len(pos), len(neg))
            chosen = []
            for group in (pos, neg):
                idx = torch.tensor([i for i, _ in group])
                if len(group) > keep:
                    top = torch.topk(torch.tensor([abs(v) for _, v in group]), keep).indices
                    idx = idx[top]
                chosen += idx.tolist()
            ind = [[float(b * w + t in chosen) for t in range(w)] for b in range(n)]
    out = []
    for b in range(n):
        row = []
        for t in range(w):
            bonus = eta * ind[b][t] * (sde[b] - rows[b][t])
            main = 0.0 if bonus != 0 else d[b][t]
            row.append(main + bonus)
        out.append(row)
    return out


def test_turning_points_match_the_authors_run_on_random_sequences_with_ties():
    rng = random.Random(0)
    # rewards on a coarse grid: ties between intermediate and final rewards are frequent
    rows = [[rng.randint(0, 4) / 4 for _ in range(6)] for _ in range(400)]
    ours, _ = step_rewards(torch.tensor(rows, dtype=torch.float64))
    assert torch.allclose(ours, torch.tensor(authors_op3(rows), dtype=torch.float64), atol=1e-12)
    first, _ = step_rewards(torch.tensor(rows, dtype=torch.float64), consistent_steps="first")
    assert torch.allclose(first, torch.tensor(authors_op3(rows, inter_consistent=False), dtype=torch.float64))
    changed = (first != ours).any(1).float().mean()
    assert 0.05 < changed < 0.6  # the consistency condition at every step changes many rows


def test_a_zero_bonus_keeps_the_increment_as_the_authors_drop_rule_does():
    # D = 0.5 > 0; d = [1, -0.5, 1.5, -1.5]; step 2 flips back (first-step-only consistency) but R_2 = R_W
    rows = [[0.0, 1.0, 0.5, 2.0, 0.5]]
    ours, tp = step_rewards(torch.tensor(rows, dtype=torch.float64), consistent_steps="first")
    assert tp[0, 2]
    assert ours[0, 2] == 1.5  # d_2, not eta (R_W - R_2) = 0
    assert torch.allclose(ours, torch.tensor(authors_op3(rows, inter_consistent=False), dtype=torch.float64))
    ours, _ = step_rewards(torch.tensor(rows, dtype=torch.float64), eta=0.0)
    assert torch.allclose(ours, torch.tensor(authors_op3(rows, eta=0.0), dtype=torch.float64))


def test_balanced_bonus_matches_the_authors_topk_on_continuous_rewards():
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        rows = torch.rand(9, 6, generator=gen, dtype=torch.float64)
        ours, tp = step_rewards(rows, balanced=True)
        ref = torch.tensor(authors_op3(rows.tolist(), balanced=True), dtype=torch.float64)
        assert torch.allclose(ours, ref, atol=1e-12)
        trend = rows[:, -1] - rows[:, 0]
        unbalanced = step_rewards(rows)[1]
        n_pos, n_neg = int((unbalanced & (trend[:, None] > 0)).sum()), int((unbalanced & (trend[:, None] < 0)).sum())
        if n_pos and n_neg:
            assert int((tp & (trend[:, None] > 0)).sum()) == int((tp & (trend[:, None] < 0)).sum()) == min(n_pos, n_neg)


def test_flow_grpo_kl_is_dt_times_the_exact_kl():
    gen = torch.Generator().manual_seed(2)
    x, v, v_ref = (torch.randn(3, 4, 8, 8, generator=gen) for _ in range(3))
    a = 0.7
    for s, s_next in [(1.0, 0.9), (0.6, 0.45), (0.2, 0.1)]:
        mean, std = SAMPLERS.get("flow_sde")(x, v, s, s_next, a)
        mean_ref, _ = SAMPLERS.get("flow_sde")(x, v_ref, s, s_next, a)
        # Flow-GRPO: std_dev_t = sqrt(sigma / (1 - where(sigma == 1, sigma_max, sigma))) * noise_level,
        # kl = ((mu - mu_ref) ** 2).mean(dims) / (2 * std_dev_t ** 2)  (sigma_max: the level after 1)
        std_dev_t = math.sqrt(s / (1 - (s_next if s == 1 else s))) * a
        authors = ((mean - mean_ref) ** 2).mean(dim=(1, 2, 3)) / (2 * std_dev_t ** 2)
        ours = gaussian_mean_kl(mean, mean_ref, std) * flow_grpo_kl_factor("flow_sde", s, s_next)
        assert torch.allclose(ours, authors, rtol=1e-5)
        exact = 0.5 * ((mean - mean_ref) ** 2).mean(dim=(1, 2, 3)) / (std_dev_t ** 2 * (s - s_next))
        assert torch.allclose(gaussian_mean_kl(mean, mean_ref, std), exact, rtol=1e-5)
    # CPS: its std_dev_t is the step std, so Flow-GRPO's form is the exact one
    mean, std = SAMPLERS.get("cps")(x, v, 0.6, 0.45, a)
    mean_ref, _ = SAMPLERS.get("cps")(x, v_ref, 0.6, 0.45, a)
    authors = ((mean - mean_ref) ** 2).mean(dim=(1, 2, 3)) / (2 * (0.45 * math.sin(a * math.pi / 2)) ** 2)
    assert torch.allclose(gaussian_mean_kl(mean, mean_ref, std) * flow_grpo_kl_factor("cps", 0.6, 0.45), authors, rtol=1e-5)
    with pytest.raises(ValueError, match="kl_form"):
        flow_grpo_kl_factor("dance", 0.6, 0.45)


def test_cps_authors_logprob_and_its_ratio():
    gen = torch.Generator().manual_seed(3)
    x, v, v_new = (torch.randn(2, 4, 8, 8, generator=gen) for _ in range(3))
    s, s_next, a = 0.6, 0.45, 0.7
    mean, std = SAMPLERS.get("cps")(x, v, s, s_next, a)
    mean_new, _ = SAMPLERS.get("cps")(x, v + 0.05 * v_new, s, s_next, a)
    sample = mean + std * torch.randn(mean.shape, generator=gen)
    # the authors: log_prob = -((prev_sample - prev_sample_mean) ** 2), mean over all but the batch dim
    authors = -((sample - mean) ** 2).mean(dim=(1, 2, 3))
    assert torch.allclose(cps_authors_logprob(sample, mean, std), authors)
    true_log_ratio = gaussian_logprob(sample, mean_new, std) - gaussian_logprob(sample, mean, std)
    authors_log_ratio = cps_authors_logprob(sample, mean_new, std) - cps_authors_logprob(sample, mean, std)
    assert torch.allclose(authors_log_ratio, 2 * std ** 2 * true_log_ratio, rtol=1e-4, atol=1e-7)


def test_d1_preset_sets_d1s_published_run():
    from mmrl.registry import RECIPES
    cfg = load_recipe(RECIPES.get("dlm_d1"))
    # diffu-grpo/slurm_scripts/train.yaml with DiffuGRPOConfig's defaults for the keys it leaves out
    assert cfg.policy["estimator"] == "diffu_grpo" and cfg.policy["p_mask"] == 0.15
    assert (cfg.policy["gen_length"], cfg.policy["block_length"], cfg.policy["steps"]) == (256, 32, 128)
    assert cfg.policy["temperature"] == 0.9 and cfg.policy["remasking"] == "low_confidence"
    alg = cfg.algorithm
    assert (alg.estimator, alg.group_size, alg.mu, alg.beta, alg.kl_estimator) == ("dr_grpo", 6, 12, 0.04, "k3")
    assert (alg.eps_low, alg.eps_high, alg.aggregation) == (0.5, 0.5, "token_mean")
    assert (cfg.optim.lr, cfg.optim.betas, cfg.optim.weight_decay, cfg.optim.max_grad_norm) == (3e-6, [0.9, 0.99], 0.1, 0.2)
    assert (cfg.optim.lora.r, cfg.optim.lora.alpha, cfg.optim.lora.dropout) == (128, 64, 0.05)


def test_d1_advantages_are_reward_minus_group_mean():
    from mmrl.core.advantages import compute_advantages
    from mmrl.registry import RECIPES
    cfg = load_recipe(RECIPES.get("dlm_d1"))
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.2, 0.4, 0.0, 0.0, 0.0, 0.6])
    group_id = torch.arange(2).repeat_interleave(6)
    # d1: advantages = rewards - rewards.view(-1, num_generations).mean(1).repeat_interleave(num_generations)
    ref = rewards - rewards.view(-1, 6).mean(1).repeat_interleave(6)
    adv = compute_advantages({"r": rewards}, {"r": 1.0}, group_id, cfg.algorithm).advantages
    assert torch.allclose(adv.float(), ref, atol=1e-6)


def _tiny_sd3(**kw):
    from mmrl.tasks.diffusion.config import DiffusionConfig
    from mmrl.tasks.diffusion.policy import DiffusionPolicy
    args = {"model": "tiny:sd3", "height": 32, "width": 32, "num_steps": 4, "eval_num_steps": 4, "noise_level": 0.7}
    args.update(kw)
    return DiffusionPolicy(DiffusionConfig(**args))


def test_the_options_reach_the_diffusion_policy():
    import contextlib
    import copy
    policy = _tiny_sd3(sampler="cps", cps_logprob="authors")
    batch = policy.rollout(["red circle"], 2, seeds=[5])
    ex, mask = batch.extras, batch.unit_mask.bool()
    with torch.no_grad():
        logp, _ = policy.logprobs(policy.model, batch)
        k = 1
        mean, _ = policy.step_means(policy.model, batch, k, torch.arange(len(batch)))
    assert torch.allclose(logp[mask], batch.rollout_logp[mask], atol=1e-6)  # on-policy ratio 1 in this form too
    assert torch.allclose(logp[:, k], -((ex["latents"][:, k + 1] - mean) ** 2).flatten(1).mean(1), atol=1e-6)
    # Flow-GRPO's KL on a perturbed reference: |dt| times the exact one per flow_sde step
    policy = _tiny_sd3(sampler="flow_sde")
    ref = copy.deepcopy(policy.model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    batch = policy.rollout(["red circle"], 2, seeds=[5])
    with torch.no_grad():
        _, _, exact = policy.logprobs_and_kl(policy.model, lambda: contextlib.nullcontext(ref), batch)
        policy.cfg.kl_form = "flow_grpo"
        _, _, authors = policy.logprobs_and_kl(policy.model, lambda: contextlib.nullcontext(ref), batch)
    dt = (batch.extras["levels"][0, :-1] - batch.extras["levels"][0, 1:]).float()
    trained = mask.any(0)
    assert (exact[:, trained] > 0).all()
    assert torch.allclose(authors[:, trained], exact[:, trained] * dt[trained], rtol=1e-5)


def test_option_errors_name_the_field():
    with pytest.raises(ValueError, match="policy.kl_form"):
        _tiny_sd3(kl_form="flowgrpo")
    with pytest.raises(ValueError, match="kl_form=flow_grpo"):
        _tiny_sd3(sampler="dance", kl_form="flow_grpo")
    with pytest.raises(ValueError, match="policy.cps_logprob"):
        _tiny_sd3(sampler="flow_sde", cps_logprob="authors")
    with pytest.raises(ValueError, match="policy.tp_consistent_steps"):
        _tiny_sd3(tp_consistent_steps="every")


def authors_stat_tracker(prompts: list[str], rewards: list[float], global_std: bool) -> list[float]:
    """PerPromptStatTracker.update as DiffusionNFT and Flow-GRPO run it (NVlabs/DiffusionNFT and
    yifan123/flow_grpo, flow_grpo/stat_tracking.py; global_std is their config's default), written
    out: each row minus the mean of its prompt's rewards, over the std of every reward of the batch
    (global_std) or of its prompt's rewards, plus 1e-4; numpy's std divides by n."""
    def std(xs):
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
    out = []
    for prompt, r in zip(prompts, rewards):
        same = [x for q, x in zip(prompts, rewards) if q == prompt]
        out.append((r - sum(same) / len(same)) / (std(rewards if global_std else same) + 1e-4))
    return out


def test_nft_normalises_rewards_by_the_authors_population_std():
    """The nft objective's default (algorithm.std_ddof: null) is the authors' numpy std, with the
    batch's std (their global_std) or the prompt's; std_ddof 1 is the unbiased std, every advantage
    then smaller by sqrt((N - 1) / N) (N the rewards the std is taken over: 6.5% at N = 8)."""
    rng = random.Random(2)
    worst = 0.0
    for _ in range(120):
        groups, size = rng.randint(1, 5), rng.choice([2, 3, 8, 24])
        gid = [g for g in range(groups) for _ in range(size)]
        rng.shuffle(gid)  # a group's rows need not be consecutive
        rewards = [rng.choice([rng.random(), rng.randint(0, 2) / 2]) for _ in gid]
        for std in ("batch", "group"):
            cfg = AlgorithmConfig(estimator="grpo", std=std, eps=1e-4, objective="nft")
            ours = compute_advantages({"r": torch.tensor(rewards, dtype=torch.float64)}, {"r": 1.0},
                                      torch.tensor(gid), cfg).advantages
            theirs = torch.tensor(authors_stat_tracker([f"p{g}" for g in gid], rewards, std == "batch"))
            worst = max(worst, float(((ours.double() - theirs).abs() / theirs.abs().clamp(min=1)).max()))
    assert worst < 1e-5, worst  # float32 advantages
    rewards = torch.tensor([0.1, 0.9, 0.4, 0.4, 0.7, 0.2, 1.0, 0.0], dtype=torch.float64)
    one_group = torch.zeros(8, dtype=torch.long)
    population, unbiased = (compute_advantages({"r": rewards}, {"r": 1.0}, one_group, AlgorithmConfig(
        estimator="grpo", std="batch", eps=0.0, objective="nft", std_ddof=ddof)).advantages for ddof in (None, 1))
    assert torch.allclose(unbiased, population * math.sqrt(7 / 8), rtol=1e-6)
    assert std_ddof(AlgorithmConfig(objective="nft")) == 0 and std_ddof(AlgorithmConfig()) == 1
    flow_grpo = [load_recipe(RECIPES.get(name)).algorithm for name in ("t2i_flowgrpo", "t2i_flowgrpo_fast",
                                                                       "t2i_grpo_guard", "t2i_nft")]
    assert [std_ddof(a) for a in flow_grpo] == [0, 0, 0, 0]  # their code's stat tracker
    assert std_ddof(load_recipe(RECIPES.get("t2i_flowdppo")).algorithm) == 1  # UniRL's torch std
