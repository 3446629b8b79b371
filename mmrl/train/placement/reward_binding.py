"""Where each of the recipe's rewards is scored: in this process, bound to its arguments and columns,
by its server (`rewards.NAME.url` / `server`), or by the run's placed reward servers (`placement.reward`);
the trainer and the rollout worker bind them alike."""

from __future__ import annotations

from mmrl.config.sections import TrainConfig
from mmrl.core.advantages import check_reward_combine
from mmrl.core.scoring import RewardFn, bind_reward
from mmrl.serving.remote_reward import is_served, served_reward
from mmrl.train.placement.placed_servers import reward_slots


def bound_rewards(cfg: TrainConfig) -> tuple[dict[str, RewardFn], dict[str, float]]:
    """The recipe's rewards bound to their arguments and columns, and their weights (checked)."""
    placed = reward_slots(cfg)
    fns = {name: served_reward(name, spec, placed[name], cfg.placement.server_timeout_s) if name in placed
           else served_reward(name, spec) if is_served(spec) else bind_reward(name, spec.args, spec.columns)
           for name, spec in cfg.rewards.items()}
    weights = {name: spec.weight for name, spec in cfg.rewards.items()}
    if cfg.sampling.variance_reward is not None and cfg.sampling.variance_reward not in weights:
        raise ValueError(f"sampling.variance_reward={cfg.sampling.variance_reward!r} is not one of the "
                         f"rewards {sorted(weights)}")
    check_reward_combine(cfg.algorithm.reward_combine, cfg.algorithm.gates, weights)
    return fns, weights
