"""A reward that sends its own process a signal ($MMRL_TEST_KILL_SIGNAL, default SIGKILL) on call
number $MMRL_TEST_KILL_AT (one call per step), raises there when the "signal" is ``raise``, or kills
this process's multiprocessing children (the run's rollout worker) when it is ``children``, to test
that a killed, preempted or failed run (or one whose worker died) resumes exactly."""

import multiprocessing
import os
import signal

from mmrl.rewards import register_reward

_calls = 0


@register_reward("killer")
def killer(prompts, completions, **columns):
    global _calls
    _calls += 1
    if _calls == int(os.environ.get("MMRL_TEST_KILL_AT", "0")):
        if os.environ.get("MMRL_TEST_KILL_SIGNAL") == "raise":
            raise RuntimeError(f"the killer reward fails on call {_calls}")
        if os.environ.get("MMRL_TEST_KILL_SIGNAL") == "children":
            for child in multiprocessing.active_children():
                child.kill()
                child.join()
            return [0.0] * len(completions)
        os.kill(os.getpid(), getattr(signal, os.environ.get("MMRL_TEST_KILL_SIGNAL", "SIGKILL")))
    return [0.0] * len(completions)
