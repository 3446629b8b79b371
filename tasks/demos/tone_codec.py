"""The speak demo's codec: a fixed codec of sine-wave speech frames, with Mimi's encode / decode
interface, and the tiny CSM speaker over it (``tiny:csm-tones``).

A random Mimi makes no sound an ASR judge can hear, so the demo's speaker talks through a codec the
judge can: each frame is 0.1 s at 16 kHz, two codebooks of 8 codes. Codebook 0 is the sound:
1 silence, 2-6 a syllable of the vowel a, e, i, o, u (two sine tones at its formants under a
raised-cosine envelope, as the asr demo's synthetic speech, `synthetic/spoken_words.py`), 7 a hiss,
each over a fixed noise floor as that speech has;
code 0 is CSM's end marker (`codebook_eos_token_id`), decoded as silence. Codebook 1 shifts the
formants by -4% .. +3% (the pitch shifts the judge was trained on). A digit word is its two
vowels' frames; words are separated by a silence frame. `encode` is the nearest decoded frame, so a
decoded waveform round-trips exactly (each code pair's frame has its own noise floor).

The codec replaces the stock model's `codec_model`: the adapter decodes through
``model.codec_model.decode(codes).audio_values`` and encodes reference audio through
``.encode(wave).audio_codes``, as with Mimi. It has no weights, so a saved checkpoint holds the
speaker alone (loaded in the stock class, the codec would be the config's random Mimi).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn
from transformers.models.mimi.modeling_mimi import MimiDecoderOutput, MimiEncoderOutput

from ..model_loading import TINY_MODELS
from .synthetic.spoken_words import RATE, VOWELS, WORDS, syllable
from .tiny_speech import csm_char

FRAME_SECONDS = 0.1
FRAME = int(RATE * FRAME_SECONDS)  # samples a frame
CODEBOOK_SIZE = 8
END, SILENCE, HISS = 0, 1, 7
VOWEL_CODES = {v: 2 + i for i, v in enumerate(sorted(VOWELS))}  # a e i o u -> 2..6
SHIFTS = [0.96 + 0.01 * i for i in range(CODEBOOK_SIZE)]
LOUDNESS = 0.3
NOISE = 0.003  # the synthetic speech's noise floor (about -40 dB): the judges never heard digital silence


def frame_templates() -> Tensor:
    """The decoded frame [FRAME] of each (sound, shift) code pair: [CODEBOOK_SIZE, CODEBOOK_SIZE, FRAME]."""
    rng = np.random.default_rng(0)
    out = (rng.standard_normal((CODEBOOK_SIZE, CODEBOOK_SIZE, FRAME)) * NOISE).astype(np.float32)
    for vowel, code in VOWEL_CODES.items():
        for k, shift in enumerate(SHIFTS):
            out[code, k] += LOUDNESS * syllable(vowel, FRAME_SECONDS, shift)[:FRAME]
    out[HISS] += rng.standard_normal(FRAME).astype(np.float32) * 0.05
    return torch.from_numpy(out)


def word_codes(text: str, shift_code: int = 4) -> Tensor:
    """The codes [2, T] that say `text` (digit words, `WORDS`): a silence frame, then each word's two
    vowel frames followed by a silence frame, every frame at shift `shift_code`."""
    sounds = [SILENCE]
    for word in text.split():
        if word not in WORDS:
            raise ValueError(f"tone codec: word {word!r} is not in the vocabulary {sorted(WORDS)}")
        sounds += [VOWEL_CODES[v] for v in WORDS[word]] + [SILENCE]
    return torch.tensor([sounds, [shift_code] * len(sounds)])


class ToneCodec(nn.Module):
    """Frames of sine-wave speech (module docstring); Mimi's `encode` / `decode` outputs."""

    def __init__(self):
        super().__init__()
        self.register_buffer("templates", frame_templates(), persistent=False)  # [sound, shift, FRAME]

    @property
    def dtype(self) -> torch.dtype:
        return self.templates.dtype

    def decode(self, audio_codes: Tensor, **kwargs) -> MimiDecoderOutput:
        """Waveforms [B, 1, T * FRAME] of codes [B, 2, T]."""
        sound, shift = audio_codes[:, 0].clamp(0, CODEBOOK_SIZE - 1), audio_codes[:, 1].clamp(0, CODEBOOK_SIZE - 1)
        frames = self.templates[sound, shift]  # [B, T, FRAME]
        return MimiDecoderOutput(audio_values=frames.reshape(frames.shape[0], 1, -1))

    def encode(self, input_values: Tensor, **kwargs) -> MimiEncoderOutput:
        """Codes [B, 2, T] of waveforms [B, 1, S] (S cut to whole frames): each frame's nearest decoded frame."""
        batch = input_values.shape[0]
        frames = input_values.reshape(batch, -1)[:, : input_values.shape[-1] // FRAME * FRAME].reshape(batch, -1, FRAME)
        flat = self.templates[1:].reshape(-1, FRAME).to(frames.dtype)  # the end marker is never encoded
        nearest = torch.cdist(frames, flat[None].expand(batch, -1, -1)).argmin(-1)  # [B, T]
        return MimiEncoderOutput(audio_codes=torch.stack([1 + nearest // CODEBOOK_SIZE, nearest % CODEBOOK_SIZE], 1))


@TINY_MODELS.register("csm-tones")
def csm_tones(hidden: int = 64, layers: int = 2, heads: int = 4, seed: int = 0):
    """The tiny CSM (`tiny_speech.csm_char`) with two codebooks of 8 codes, speaking through `ToneCodec`
    at 16 kHz; returns (model, tokenizer)."""
    model, tokenizer = csm_char(hidden=hidden, layers=layers, heads=heads, codebooks=2, codebook_size=CODEBOOK_SIZE,
                                seed=seed)
    model.codec_model = ToneCodec()
    model.config.codec_config.sampling_rate = RATE
    return model, tokenizer
