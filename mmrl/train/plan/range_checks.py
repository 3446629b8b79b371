"""The range of every number a recipe gives (`RANGES`: group size >= 2, positive counts and rates,
...), checked with the recipe (`validate`) and again for each stage's settings."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mmrl.config.sections import TrainConfig

# dotted key -> (rule, what the rule says); a value of None (an unset optional) is not checked
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {}


def _rule(keys: str, test: Callable[[Any], bool], text: str) -> None:
    for key in keys.split():
        RANGES[key] = (test, text)


_rule("algorithm.group_size", lambda v: v >= 2, "must be >= 2 (advantages compare the rollouts of a group)")


_rule("algorithm.mu optim.prompts_per_step optim.micro_batch_size max_steps max_bad_steps eval.max_prompts "
      "eval.group_size warm_start.batch_size sampling.variance_window sampling.dynamic_max_tries "
      "save_total_limit algorithm.max_units", lambda v: v >= 1, "must be >= 1")


_rule("optim.lr save_every eval.every logging.plot_every logging.print_every warm_start.steps warm_start.warmup_steps optim.warmup_steps "
      "optim.lora.r seed scoring.groups_per_call algorithm.eps algorithm.eps_low "
      "algorithm.eps_high algorithm.beta algorithm.llds_coef algorithm.prune_threshold optim.weight_decay "
      "algorithm.train_extremes",
      lambda v: v >= 0, "must be >= 0")


_rule("warm_start.lr optim.max_grad_norm warm_start.max_grad_norm algorithm.clip_advantage "
      "algorithm.max_reward optim.lora.alpha algorithm.rollout_correction_cap algorithm.nft_beta algorithm.nft_adv_clip",
      lambda v: v > 0, "must be > 0")


_rule("algorithm.dual_clip", lambda v: v > 1, "must be > 1 (dual-clip bound c, Ye et al. 2020)")


_rule("optim.lora.dropout", lambda v: 0 <= v < 1, "must be in [0, 1)")


_rule("sampling.variance_mix", lambda v: 0 <= v <= 1, "must be in [0, 1]")


_rule("optim.betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "must be two numbers in [0, 1)")


_rule("algorithm.chunks", lambda v: len(v) > 0 and all(c >= 1 for c in v), "must be positive unit counts")


def _get(cfg: Any, dotted: str) -> tuple[bool, Any]:
    node = cfg
    for part in dotted.split("."):
        if not hasattr(node, part):
            return False, None  # a field another version of the config does not have
        node = getattr(node, part)
    return True, node


def check_ranges(cfg: TrainConfig, problems: list[str]) -> None:
    for key, (test, text) in RANGES.items():
        present, value = _get(cfg, key)
        if not present or value is None:
            continue
        numbers = value if isinstance(value, list) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            problems.append(f"{key}={value!r} must be a finite number")
        elif not test(value):
            problems.append(f"{key}={value!r} {text}")
