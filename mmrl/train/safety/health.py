"""Steps that train nothing, said out loud: a reward that gave no value for any row of a step, a
whole step without a reward (a stop after `max_bad_steps` in a row), a step whose dynamic sampling
kept no group (every group's rewards equal), and a gradient norm stuck at exactly 0 after non-zero
ones (a saturated model)."""

from __future__ import annotations

import logging
import math

from mmrl.errors import UserError

logger = logging.getLogger(__name__)

SATURATED_STEPS = 3  # steps in a row with rows to train and a gradient norm of exactly 0


class NonFiniteError(UserError):
    """`max_bad_steps` optimizer steps in a row had a NaN/inf loss or gradient norm (the trainer stops
    the run after a checkpoint)."""


class NoRewardError(UserError):
    """`max_bad_steps` steps in a row in which no reward gave a value for any row."""


def _missing(value) -> bool:
    return not isinstance(value, (int, float)) or math.isnan(value)


class RunHealth:
    """Checks each step's metrics; warns once per cause (where `warn` is True, the main process) and
    raises `NoRewardError` after `max_bad_steps` steps in a row without any reward."""

    def __init__(self, max_bad_steps: int, warn: bool = True):
        self.max_bad_steps = max_bad_steps
        self.warn = warn
        self.silent_rewards: set[str] = set()  # already warned about
        self.steps_without_reward = 0
        self.saw_gradient = False
        self.zero_gradient_steps = 0
        self.warned_saturation = False
        self.warned_uniform_groups = False

    def check(self, step: int, metrics: dict[str, float]) -> None:
        self._check_rewards(step, metrics)
        self._check_gradient(step, metrics)

    def _say(self, message: str) -> None:
        if self.warn:
            logger.warning(message)

    def _check_rewards(self, step: int, metrics: dict[str, float]) -> None:
        if metrics.get("sampling/groups") == 0:  # the step kept no group: its rewards were not logged
            if metrics.get("rollout/stale_dropped", 0.0) == 0 and not self.warned_uniform_groups:
                self.warned_uniform_groups = True  # not dropped as stale (rollout.stale_rows): dynamic sampling
                self._say(f"step {step}: every group of the step's {metrics.get('sampling/tries', 0):.0f} draws had "
                          "equal rewards (sampling.dynamic), so the step trained nothing; the policy is saturated on "
                          "these prompts, or the reward is constant")
            return
        rewards = [k.removeprefix("reward/") for k in metrics if k.startswith("reward/") and k.count("/") == 1]
        for name in rewards:
            if name not in self.silent_rewards and _missing(metrics[f"reward/{name}"]):
                self.silent_rewards.add(name)
                self._say(f"step {step}: reward {name!r} returned None for every completion of the step "
                          "(None means 'does not apply'); check its data columns and arguments")
        self.steps_without_reward = self.steps_without_reward + 1 if _missing(metrics.get("reward_mean")) else 0
        if self.steps_without_reward >= self.max_bad_steps:
            first = step - self.steps_without_reward + 1
            raise NoRewardError(
                f"steps {first}-{step}: no reward ({', '.join(rewards)}) gave a value for any completion, "
                f"{self.steps_without_reward} steps in a row (max_bad_steps={self.max_bad_steps}), so nothing "
                "trained and the run stopped; a reward returns None where it does not apply: check the rewards' "
                "data columns and arguments")

    def _check_gradient(self, step: int, metrics: dict[str, float]) -> None:
        grad_norm, skipped = metrics.get("grad_norm"), metrics.get("skipped_frac", 0.0)
        if _missing(grad_norm) or skipped >= 1.0:
            return  # no rows to train: a zero gradient is expected
        if grad_norm != 0.0:
            self.saw_gradient, self.zero_gradient_steps = True, 0
            return
        self.zero_gradient_steps += self.saw_gradient
        if self.zero_gradient_steps == SATURATED_STEPS and not self.warned_saturation:
            self.warned_saturation = True
            self._say(f"step {step}: the gradient norm has been exactly 0 for {SATURATED_STEPS} steps in a row "
                      "after non-zero ones, though rows had advantages: the model looks saturated (its "
                      "probabilities are 0 or 1); lower optim.lr")
