"""A reward that kills this process's multiprocessing children (the run's rollout worker) on call
number $MMRL_TEST_KILL_WORKER_AT (one call per step), to test that a dead worker stops the run
after a checkpoint and that resuming starts a new one."""

import multiprocessing
import os

from mmrl.rewards import register_reward

_calls = 0


@register_reward("worker_killer")
def worker_killer(prompts, completions, **columns):
    global _calls
    _calls += 1
    if _calls == int(os.environ.get("MMRL_TEST_KILL_WORKER_AT", "0")):
        for child in multiprocessing.active_children():
            child.kill()
            child.join()
    return [0.0] * len(completions)
