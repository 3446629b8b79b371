"""A reward that, on its first call, creates $MMRL_TEST_PAUSE_DIR/paused and waits until
$MMRL_TEST_PAUSE_DIR/go exists: a run that stays alive while a test starts a second one beside it."""

import os
import time
from pathlib import Path

from mmrl.rewards import register_reward

_paused = False


@register_reward("pause")
def pause(prompts, completions, **columns):
    global _paused
    if not _paused:
        _paused = True
        folder = Path(os.environ["MMRL_TEST_PAUSE_DIR"])
        (folder / "paused").touch()
        deadline = time.monotonic() + 300
        while not (folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    return [0.0] * len(completions)
