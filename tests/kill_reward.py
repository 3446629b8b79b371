"""A reward that SIGKILLs its own process on call number $MMRL_TEST_KILL_AT (one call per step),
to test that a killed run resumes exactly."""

import os
import signal

from rewards import register_reward

_calls = 0


@register_reward("killer")
def killer(prompts, completions, **columns):
    global _calls
    _calls += 1
    if _calls == int(os.environ.get("MMRL_TEST_KILL_AT", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
    return [0.0] * len(completions)
