"""Text-audio agreement: the CLAP score of a sound against its text, cos(E_audio(sound), E_text(text))
of LAION CLAP (transformers' `ClapModel`, laion/larger_clap_general by default, as UniRL's `clap`
reward's matched cosine): both embeddings L2-normalised in fp32, audio resampled to the feature
extractor's rate (48 kHz) and batched through `ClapProcessor` (its padding or truncation to 10 s).
The text is the row's `caption` column when the data has one, else the prompt. Served like any
reward (`rewards.clap.url`)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from mmrl.core.scoring import register_reward

from .audio_models import load_audio_model, resample, waveform
from .outputs import AUDIO


def _load_clap(name: str) -> tuple[Any, Any]:
    from transformers import ClapModel, ClapProcessor
    return ClapProcessor.from_pretrained(name), ClapModel.from_pretrained(name)


def _features(value: Any) -> torch.Tensor:
    """The projected embedding of a `get_*_features` result (a tensor, or an output whose pooler holds it)."""
    return value if torch.is_tensor(value) else value.pooler_output


@torch.no_grad()
def clap_scores(processor: Any, model: Any, waves: list, texts: list[str]) -> torch.Tensor:
    """cos(E_audio, E_text) [N], fp32, of waveforms already at the feature extractor's rate and their texts."""
    param = next(model.parameters())
    rate = processor.feature_extractor.sampling_rate
    audio_in = processor.feature_extractor(waves, sampling_rate=rate, return_tensors="pt")
    text_in = processor.tokenizer(texts, padding=True, return_tensors="pt")
    audio = _features(model.get_audio_features(input_features=audio_in["input_features"].to(param.device, param.dtype),
                                               is_longer=audio_in.get("is_longer")))
    text = _features(model.get_text_features(input_ids=text_in["input_ids"].to(param.device),
                                             attention_mask=text_in["attention_mask"].to(param.device)))
    audio, text = (torch.nn.functional.normalize(x.float(), dim=-1) for x in (audio, text))
    return (audio * text).sum(-1)


@register_reward("clap", outputs=AUDIO)
def clap(prompts, completions, caption: Sequence[Any] | None = None, model: str = "laion/larger_clap_general",
         sampling_rate: int | None = None, batch_size: int = 8, device: Any = None, **kwargs) -> list[float | None]:
    """The CLAP cosine of each audio completion with its caption (or prompt); module docstring."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"clap: batch_size={batch_size!r} must be a positive integer")
    texts = [str(c) if c is not None else str(p.get("prompt") if isinstance(p, dict) else p)
             for c, p in zip(caption if caption is not None else [None] * len(prompts), prompts)]
    processor, net = load_audio_model("clap", model, device, _load_clap)
    rate = processor.feature_extractor.sampling_rate
    waves = [resample(*waveform("clap", c, i, sampling_rate), rate) for i, c in enumerate(completions)]
    out: list[float | None] = []
    for start in range(0, len(waves), batch_size):
        out.extend(clap_scores(processor, net, waves[start:start + batch_size], texts[start:start + batch_size]).tolist())
    return out
