"""A reward module for tests that run offline: registers the tiny random speaker encoder and CLAP as the
judges named `tiny-speaker` and `tiny-clap`, and a tiny random Whisper as the ASR judge `tiny-tts-judge`
(loaded by `mmrl serve-reward --reward-module`, or by a recipe's `reward_modules`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_rewards_wer import _tiny_whisper  # noqa: E402
from tiny_audio_judges import tiny_clap, tiny_speaker_encoder  # noqa: E402

from mmrl.rewards.audio_models import register_audio_model  # noqa: E402
from mmrl.rewards.wer import register_asr_model  # noqa: E402

register_audio_model("speaker", "tiny-speaker", *tiny_speaker_encoder())
register_audio_model("clap", "tiny-clap", *tiny_clap())
register_asr_model("tiny-tts-judge", *_tiny_whisper())
