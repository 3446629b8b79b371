"""Steps that train nothing, said out loud: a reward that gave no value for any row of a step, a
whole step without a reward (said at once with each reward's cause: its requests failed and were
skipped, its judge's answers could not be read, or it returned None; a stop after `max_bad_steps`
such steps in a row, and a run whose every step was one ends in an error), a step whose dynamic
sampling kept no group because every group's rewards were equal (a warning, never a stop), and a
gradient norm stuck at exactly 0 after non-zero ones (a saturated model)."""

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
    """`max_bad_steps` steps in a row in which no reward gave a value for any row, or a run whose
    every step was one (it trained on nothing)."""


def _missing(value) -> bool:
    return not isinstance(value, (int, float)) or math.isnan(value)


def absence(name: str, metrics: dict[str, float]) -> str:
    """Why reward `name` gave no row of the step a value, from the step's metrics: its requests failed
    and were skipped (`reward/NAME/failed_frac`), its judge's answers could not be read
    (`unparsed_frac`), or it returned None."""
    failed = metrics.get(f"reward/{name}/failed_frac", 0.0)
    unparsed = metrics.get(f"reward/{name}/unparsed_frac", 0.0)
    if failed >= 1.0:
        return (f"failed on every row sent to its server, and rewards.{name}.client.on_failure=skip left "
                "them without it")
    if unparsed >= 1.0:
        return f"got no answer it could read as a score: reward/{name}/unparsed_frac is 1.0, see rewards.{name}.args"
    if failed or unparsed:
        return f"gave no row a value: {failed:.0%} of its rows failed and were skipped, {unparsed:.0%} were unreadable"
    return "returned None for every row, which means 'does not apply': check its data columns and arguments"


class RunHealth:
    """Checks each step's metrics; warns (where `warn` is True, the main process), raises
    `NoRewardError` after `max_bad_steps` steps in a row without any reward, and at the end (`finish`)
    when every step was one."""

    def __init__(self, max_bad_steps: int, warn: bool = True):
        self.max_bad_steps = max_bad_steps
        self.warn = warn
        self.silent_rewards: set[str] = set()  # already warned about
        self.steps_without_reward = 0  # in a row
        self.rewarded_steps = 0  # steps in which some reward gave some row a value
        self.unrewarded: list[int] = []  # the steps in which none did
        self.why_unrewarded = ""  # each reward's cause, the latest such step
        self.saw_gradient = False
        self.zero_gradient_steps = 0
        self.warned_saturation = False
        self.warned_uniform_groups = False

    def check(self, step: int, metrics: dict[str, float]) -> None:
        self._check_rewards(step, metrics)
        self._check_gradient(step, metrics)

    def finish(self) -> None:
        """At the end of a run: raise `NoRewardError` when no step of it had a reward for any row."""
        if self.unrewarded and not self.rewarded_steps:
            first, last = self.unrewarded[0], self.unrewarded[-1]
            raise NoRewardError(
                f"the run trained on nothing: in none of its {len(self.unrewarded)} steps ({first}-{last}) did a "
                f"reward give any completion a value ({self.why_unrewarded})")

    def _say(self, message: str) -> None:
        if self.warn:
            logger.warning(message)

    def _check_rewards(self, step: int, metrics: dict[str, float]) -> None:
        if metrics.get("sampling/groups") == 0 and metrics.get("sampling/rewarded_frac", 1.0) > 0:
            self.rewarded_steps += 1  # no group kept, though the rewards gave values (or the groups were stale)
            if metrics.get("rollout/stale_dropped", 0.0) == 0 and not self.warned_uniform_groups:
                self.warned_uniform_groups = True  # not dropped as stale (rollout.stale_rows): dynamic sampling
                self._say(f"step {step}: every group of the step's {metrics.get('sampling/tries', 0):.0f} draws had "
                          "equal rewards (sampling.dynamic), so the step trained nothing; the policy is saturated on "
                          "these prompts, or the reward is constant")
            return
        rewards = [k.removeprefix("reward/") for k in metrics if k.startswith("reward/") and k.count("/") == 1]
        if not _missing(metrics.get("reward_mean")):
            self.steps_without_reward = 0
            self.rewarded_steps += 1
            for name in rewards:
                if name not in self.silent_rewards and _missing(metrics[f"reward/{name}"]):
                    self.silent_rewards.add(name)
                    self._say(f"step {step}: reward {name!r} {absence(name, metrics)}")
            return
        self.steps_without_reward += 1
        self.unrewarded.append(step)
        self.why_unrewarded = "; ".join(f"{name!r} {absence(name, metrics)}" for name in rewards)
        self.silent_rewards.update(rewards)
        if self.steps_without_reward == 1:
            self._say(f"step {step}: no reward gave any completion a value ({self.why_unrewarded}), so the step "
                      f"trained nothing; {self.max_bad_steps} such steps in a row stop the run (max_bad_steps)")
        if self.steps_without_reward >= self.max_bad_steps:
            first = step - self.steps_without_reward + 1
            raise NoRewardError(
                f"steps {first}-{step}: no reward gave a value for any completion ({self.why_unrewarded}), "
                f"{self.steps_without_reward} steps in a row (max_bad_steps={self.max_bad_steps}), so nothing "
                "trained and the run stopped")

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
