"""CSM's prompts: the turn to be spoken, after an optional reference voice, as CSM's processor writes a
conversation, and their input embeddings as `CsmForConditionalGeneration` merges them.

A turn is ``<bos>[speaker]text<eos>``; a turn with audio (the reference voice: its transcript and clip)
is followed by one audio token per Mimi frame of the clip and an audio-eos token. At an audio token
the input embedding is the sum of the frame's codebook embeddings (the backbone's), at the audio-eos
token that of the end frame (every codebook at `codebook_eos_token_id`), elsewhere the text
embedding: `_merge_input_ids_with_input_values`'s result, without re-encoding the clip each pass
(the clip's codes are kept beside the ids as `prompt_codes`)."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor, nn


def turn_ids(tokenizer: Any, bos: int, speaker: Any, text: str) -> list[int]:
    """bos, [speaker]text, eos: one turn as CSM's chat template writes it."""
    return [bos, *tokenizer(f"[{speaker}]{text}", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]


@torch.no_grad()
def voice_codes(model: nn.Module, samples: Any) -> Tensor:
    """Mimi's codes [K, n] of a clip (float samples at the codec's rate)."""
    wave = torch.as_tensor(samples, dtype=torch.float32, device=model.device)[None, None]
    return model.codec_model.encode(wave.to(model.codec_model.dtype)).audio_codes[0].cpu()


def prompt_positions(model: nn.Module, ids: list[int], voice: tuple[list[int], Tensor] | None) -> tuple[Tensor, Tensor]:
    """(ids [L], codes [K, L]) of a prompt: the reference voice's turn (its ids, its codes [K, n]) with its
    audio and audio-eos tokens, then the turn `ids`; codes are 0 at text positions."""
    config = model.config
    k = config.num_codebooks
    if voice is None:
        return torch.tensor(ids), torch.zeros(k, len(ids), dtype=torch.long)
    voice_ids, codes = voice
    n = codes.shape[1]
    all_ids = voice_ids + [config.audio_token_id] * n + [config.audio_eos_token_id] + ids
    all_codes = torch.zeros(k, len(all_ids), dtype=torch.long)
    all_codes[:, len(voice_ids):len(voice_ids) + n] = codes
    all_codes[:, len(voice_ids) + n] = config.codebook_eos_token_id
    return torch.tensor(all_ids), all_codes


def left_padded(prompts: Sequence[tuple[Tensor, Tensor]], pad_id: int) -> dict[str, Tensor]:
    """`prompt_ids` [P, L], `prompt_mask` [P, L] and `prompt_codes` [P, K, L] padded on the left."""
    width = max(len(ids) for ids, _ in prompts)
    k = prompts[0][1].shape[0]
    out = {"prompt_ids": torch.full((len(prompts), width), pad_id, dtype=torch.long),
           "prompt_mask": torch.zeros(len(prompts), width, dtype=torch.long),
           "prompt_codes": torch.zeros(len(prompts), k, width, dtype=torch.long)}
    for i, (ids, codes) in enumerate(prompts):
        out["prompt_ids"][i, width - len(ids):] = ids
        out["prompt_mask"][i, width - len(ids):] = 1
        out["prompt_codes"][i, :, width - len(ids):] = codes
    return out


def prompt_embeddings(core: nn.Module, prompt_ids: Tensor, prompt_codes: Tensor) -> Tensor:
    """Input embeddings [P, L, H]: the text embedding, or at audio and audio-eos tokens the summed codebook
    embeddings of the codes there (module docstring)."""
    text = core.embed_text_tokens(prompt_ids)
    is_audio = (prompt_ids == core.config.audio_token_id) | (prompt_ids == core.config.audio_eos_token_id)
    if not is_audio.any():
        return text
    audio = core.backbone_model.embed_tokens(prompt_codes.transpose(1, 2))
    return torch.where(is_audio[..., None], audio, text)
