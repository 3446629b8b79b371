"""Small recipes shared by the trainer tests: a tiny Qwen2 on 1-digit addition."""

from pathlib import Path

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
