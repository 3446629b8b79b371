"""The step's time split (mmrl/train/loop/step_clock.py): each phase holds the work done in it, measured
against work of a known length placed in one phase."""

import time

import pytest
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.config.parse import parse_config
from mmrl.core.scoring import REWARDS, register_reward
from mmrl.train.loop.step_clock import PHASES, StepClock
from mmrl.train.loop.trainer import Trainer

SLEEP_S = 1.0
SLEEPING = []  # the slow reward sleeps while this holds an item


def test_phases_add_up_and_the_device_is_synchronised_at_each_phase_end():
    synced = []
    clock = StepClock(lambda: synced.append(time.perf_counter()))
    clock.start()
    with clock.phase("reward"):
        time.sleep(0.05)
    with clock.phase("backward"):
        time.sleep(0.02)
    time.sleep(0.03)  # outside every phase
    out = clock.stop()
    assert len(synced) == 2
    assert out["time_reward_s"] >= 0.05 and out["time_backward_s"] >= 0.02
    assert out["time_other_s"] >= 0.03
    assert out["time_step_s"] == pytest.approx(sum(out[f"time_{p}_s"] for p in (*PHASES, "other")))
    clock.start()  # a new step starts at zero
    assert clock.stop()["time_reward_s"] < 0.01


def slow_reward(prompts, completions, **kw):
    if SLEEPING:
        time.sleep(SLEEP_S)
    return [float(len(c) % 2) for c in completions]


def test_a_slow_reward_is_counted_as_reward_time_and_nowhere_else(tmp_path):
    """The same trainer's steps without and with a 1 s sleep in the reward: only the second step's
    reward time holds the sleep; the phases do not overlap (they add up to the step)."""
    if "step_clock_slow_reward" not in REWARDS:
        register_reward("step_clock_slow_reward")(slow_reward)
    # scoring.overlap off: with it the scorer's thread starts on the rollout before the reward phase opens,
    # and the phase holds only the wait for it (3 ms under the sleep measured on a loaded machine)
    recipe = {**TINY_RECIPE, "rewards": {"step_clock_slow_reward": {"weight": 1.0}}, "max_steps": 3,
              "scoring": {"overlap": False}}
    trainer = Trainer(parse_config(recipe, tiny_overrides(tmp_path)))
    trainer.train_step()  # warm-up
    fast = trainer.train_step()
    SLEEPING.append(True)
    try:
        slow = trainer.train_step()
    finally:
        SLEEPING.clear()
    assert slow["time_reward_s"] >= SLEEP_S > fast["time_reward_s"]
    for m in (fast, slow):
        assert all(m[f"time_{p}_s"] > 0 for p in ("generate", "forward", "backward", "optimizer"))
        assert m["time_step_s"] == pytest.approx(sum(m[f"time_{p}_s"] for p in (*PHASES, "other")))
        assert m["time_other_s"] >= 0
