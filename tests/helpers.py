"""Shared by the trainer tests: small recipes (a tiny Qwen2 on 1-digit addition), the
"streamed micro-batches equal one big batch" and "on-policy ratio is exactly 1" checks (with the
rollout-time log-probs agreeing with the training forward's)."""

from pathlib import Path

import torch

TINY_RECIPE = {
    "task": "causal_lm",
    "policy": {"model": "tiny:qwen2-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2},
               "max_new_tokens": 8},
    "data": {"name": "arithmetic", "args": {"n_train": 64, "n_eval": 8, "digits": 1}},
    "rewards": {"accuracy": {"weight": 1.0}, "digit_share": {"weight": 1.0}},
    "reward_modules": [str(Path(__file__).parent / "digit_reward.py")],
    "algorithm": {"group_size": 4},
    "optim": {"lr": 1e-3, "prompts_per_step": 4, "micro_batch_size": 8},
    "logging": {"report_to": ["none"], "progress": False, "plot_every": 2},
    "max_steps": 2,
    "seed": 0,
}


def tiny_overrides(output_dir, **extra):
    """`key=value` strings for the CLI / parse_config."""
    items = {"output_dir": str(output_dir), **extra}
    return [f"{k}={v}" for k, v in items.items()]


def streamed_grads(trainer, batch, sizes):
    """The gradients of one accumulation pass over `batch` for each micro-batch size in `sizes`."""
    out = []
    for size in sizes:
        trainer.cfg.optim.micro_batch_size = size
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.updater.accumulate_gradients(batch, trainer.updater.micro_batches(batch), None, None, with_entropy=False)
        out.append({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
    return out


def assert_grads_close(a, b):
    assert a and a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6, rtol=1e-5), name


def flow_sde_step_logprob(x, after, v, s: float, s_next: float, noise_level: float):
    """A Flow-GRPO SDE step's log-prob of each row by hand (s < 1): sigma = a sqrt(s / (1 - s)), the
    mean x + (v + sigma^2 / (2 s) (x + (1 - s) v)) dt, std sigma sqrt(-dt), fp32, mean over dims."""
    import math
    dt = s_next - s
    sigma = noise_level * math.sqrt(s / (1 - s))
    mean = x + (v + sigma ** 2 / (2 * s) * (x + (1 - s) * v)) * dt
    std = sigma * math.sqrt(-dt)
    return (-(after - mean) ** 2 / (2 * std ** 2) - math.log(std) - 0.5 * math.log(2 * math.pi)).flatten(1).mean(1)


def noiseless_latents(policy, row, seed: int):
    """The final latents of a diffusion policy's rollout of `row` drawn at noise level 0 (the ODE path,
    what the stock pipeline's call draws), the policy's noise level restored after."""
    level, policy.cfg.noise_level = policy.cfg.noise_level, 0.0
    try:
        return policy.rollout([row], 1, seeds=[seed]).extras["latents"][0, -1]
    finally:
        policy.cfg.noise_level = level


def on_policy_step_changes(trainer, rollout_atol=1e-4):
    """Run one `train_step`, assert its first update pass is exactly on-policy (ratio 1) and, with
    `rollout_atol`, that the sampler's log-probs agree with the training forward's within it (fp32),
    and return the names of the parameters the step changed. (The ratio compares the training
    forward with itself; the rollout gap compares two independent computations.)"""
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    metrics = trainer.train_step()
    assert metrics["ratio_max_dev"] == 0.0
    if rollout_atol is not None:
        assert metrics["rollout/logp_diff_max"] <= rollout_atol, metrics["rollout/logp_diff_max"]
    return [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]


# A diffusion run of one step on the tiny SD3 (32 px, 4 steps) against the mean-red image reward
TINY_IMAGE_RECIPE = {
    "task": "diffusion",
    "policy": {"model": "tiny:sd3", "height": 32, "width": 32, "num_steps": 4, "eval_num_steps": 4,
               "noise_level": 0.7},
    "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 32}},
    "rewards": {"mean_red": {"weight": 1.0}},
    "reward_modules": [str(Path(__file__).parent / "image_reward.py")],
    "algorithm": {"group_size": 3},
    "optim": {"lr": 3e-2, "prompts_per_step": 2, "micro_batch_size": 6},
    "logging": {"report_to": ["none"], "progress": False},
    "max_steps": 1,
}


# each flow training method as recipe overrides on a tiny family (the t2i recipes' settings), for the
# families' method tests
FLOW_METHODS = {
    "flow_grpo": [],
    "flow_grpo_cps": ["policy.sampler=cps"],
    "dance_grpo": ["policy.sampler=dance", "policy.schedule.kind=random_fraction", "policy.schedule.fraction=0.6"],
    "mix_grpo": ["policy.num_steps=5", "policy.schedule.kind=sliding_window", "policy.schedule.size=2"],
    "flow_grpo_fast": ["policy.num_steps=5", "policy.schedule.kind=random_window", "policy.schedule.size=2"],
    "grpo_guard": ["algorithm.ratio_norm=grpo_guard"],
    "flow_dppo": ["algorithm.trust_region=dppo", "algorithm.dppo_threshold=1e-5", "algorithm.mu=2"],
}


def shipped_recipe_trains_two_steps(name: str, tmp_path, on_policy: bool = True, overrides: tuple = ()) -> None:
    """The shipped recipe `name` (with `overrides`) on its tiny model, two steps of one prompt group of 2
    at 4 denoising steps: finite losses and (`on_policy`) the first pass's ratio exactly 1."""
    import math

    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES
    from mmrl.train.loop.trainer import Trainer
    trainer = Trainer(load_recipe(RECIPES.get(name), [
        f"output_dir={tmp_path}", "algorithm.group_size=2", "optim.prompts_per_step=1", "max_steps=2",
        "policy.num_steps=4", "logging.progress=false", "logging.report_to=[none]", *overrides]))
    for _ in range(2):
        metrics = trainer.train_step()
        assert math.isfinite(metrics["loss"]) and (not on_policy or metrics["ratio_max_dev"] == 0.0)
