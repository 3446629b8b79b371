"""Dia's prompts and records: a row's text in the speaker format and optional reference voice, prepared
by the model's own `DiaProcessor` (text bytes; the delayed bos / voice codes that fix the decoder's
first positions), the audio frames of a drawn decoder sequence (the delay reverted), and a record's
tensors padded on the right."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..lm.audio_lm import load_audio

SPEAKER_TAGS = ("[S1]", "[S2]")


@dataclass
class DiaPrompt:
    text_ids: Tensor    # [1, L] text bytes for the encoder
    delay_mask: Tensor  # [P + max_delay, K] the decoder positions the prompt fixes (pad: free to draw)
    start: int          # P: the first position the decoder draws (1 + the voice's frames)


class DiaPrompts:
    """Prompts of rows as `DiaProcessor` prepares them, with the model's delay pattern and codebook ids."""

    def __init__(self, processor: Any, config: Any, cfg: Any):
        self.processor, self.cfg = processor, cfg
        decoder = config.decoder_config
        self.audio_kwargs = {"delay_pattern": list(config.delay_pattern), "bos_token_id": decoder.bos_token_id,
                             "eos_token_id": decoder.eos_token_id, "pad_token_id": decoder.pad_token_id}
        self.pad = decoder.pad_token_id

    def text_of(self, text: str) -> str:
        text = text.strip()
        return text if text.startswith(SPEAKER_TAGS) else f"[{self.cfg.speaker}] {text}"

    def of(self, row: Any, text: str) -> DiaPrompt:
        """The prompt of a row whose text to say is `text` (a dict row may hold the voice columns)."""
        text = self.text_of(text)
        audio = None
        if self.cfg.voice_audio_column and isinstance(row, dict):
            rate = self.processor.feature_extractor.sampling_rate
            audio = [load_audio(row[self.cfg.voice_audio_column], rate)]
            text = f"{self.text_of(str(row[self.cfg.voice_text_column]))} {text}"
        out = self.processor(text=[text], audio=audio, padding=False, return_tensors="pt", **self.audio_kwargs)
        mask = out["decoder_input_ids"][0].long()
        start = int(mask.shape[0] - (mask[:, 0] == self.pad).sum())
        return DiaPrompt(text_ids=out["input_ids"].long(), delay_mask=mask, start=start)


def frames_of(ids: Tensor, start: int, end: int, delays: list[int]) -> Tensor:
    """Audio frames [K, end - start] of a decoder sequence `ids` [W, K] whose channel 0 wrote eos at `end`:
    frame f of channel k sits at position start + f + delays[k] (DiaProcessor.batch_decode's reverted delay)."""
    frames = torch.arange(end - start)
    return torch.stack([ids[start + frames + d, k] for k, d in enumerate(delays)])


def padded_right(extras: dict[str, Tensor], widths: dict[str, int], pad: int) -> dict[str, Tensor]:
    """A record's text (`text_ids`, `text_mask`) and decoder tensors (`decoder_ids`, `drawn`) padded on the
    right to `widths` (text and decoder positions): ids with 0 (the byte tokenizer's pad) and `pad`."""
    dt, dd = widths["text_ids"] - extras["text_ids"].shape[1], widths["decoder_ids"] - extras["decoder_ids"].shape[1]
    return {"text_ids": nn.functional.pad(extras["text_ids"], (0, dt)),
            "text_mask": nn.functional.pad(extras["text_mask"], (0, dt)),
            "decoder_ids": nn.functional.pad(extras["decoder_ids"], (0, 0, 0, dd), value=pad),
            "drawn": nn.functional.pad(extras["drawn"], (0, 0, 0, dd))}
