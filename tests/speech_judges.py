"""A reward module for served-reward tests: registers the tiny random speaker encoder and CLAP as the
judges named `tiny-speaker` and `tiny-clap` (loaded by `mmrl serve-reward --reward-module`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from tiny_audio_judges import tiny_clap, tiny_speaker_encoder  # noqa: E402

from mmrl.rewards.audio_models import register_audio_model  # noqa: E402

register_audio_model("speaker", "tiny-speaker", *tiny_speaker_encoder())
register_audio_model("clap", "tiny-clap", *tiny_clap())
