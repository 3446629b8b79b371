"""Text-to-speech over delayed codebooks: Nari Labs' Dia (`DiaForConditionalGeneration`) as a policy
whose units are decoder steps (`dia_steps.py`: a step's log-prob is the sum over the codebooks drawn
there of the guided sampler's log-probs, under classifier-free guidance as transformers computes it).

A prompt is the text to say in Dia's speaker format (``[S1] text``), after an optional reference
voice (its transcript goes before the text, its clip becomes the decoder's audio prefix), prepared
by the model's own `DiaProcessor`: text bytes for the encoder, the delayed bos / prompt codes that
fix the decoder's first positions. The decoder then writes steps until channel 0 writes its eos
(the others follow it after their delays) or `max_new_frames` frames, when eos is forced as in
transformers' Dia generation. Units run from the first step to the last one that draws a channel
(with one channel: the end step). Rollouts are decoded to waveforms by the processor's DAC, delay
reverted, as {"array", "sampling_rate"} completions; the codec is frozen and outside the trained model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS

from ..lm.rollout_batches import full_width, used_width
from ..model_loading import DTYPES, load_tiny, pretrained
from .dia_prompts import DiaPrompts, frames_of, padded_right
from .dia_sampling import draw_steps
from .dia_steps import step_logprobs, step_scores
from .speech_policy import ReferenceVoicePolicy


@dataclass
class DiaPolicyConfig:
    model: str = field(default="", metadata={"help": (
        "Hub id or local path of a Dia checkpoint (e.g. nari-labs/Dia-1.6B-0626, with its processor and DAC "
        "codec), or tiny:NAME for a tiny random model built from a config (tests, demos).")})
    tiny_args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments of the tiny model builder when model is tiny:NAME.")})
    dtype: str = field(default="float32", metadata={"help": (
        "Weights' dtype: float32, bfloat16 or float16 (log-probs are always computed in fp32)."),
        "choices": "mmrl.tasks.model_loading:DTYPES"})
    device: str | None = field(default=None, metadata={"help": (
        "Move the model to this device (e.g. cuda:0); null: leave placement to accelerate.")})
    speaker: str = field(default="S1", metadata={"help": (
        "The speaker tag written before each row's text, as Dia's text format: [S1] text. A text that "
        "already starts with [S1] or [S2] is kept as it is.")})
    voice_audio_column: str | None = field(default=None, metadata={"help": (
        "A data-set column holding each row's reference voice (a path or {array, sampling_rate}): its DAC "
        "codes become the decoder's audio prefix and its transcript (voice_text_column) goes before the text, "
        "as DiaProcessor takes an audio prompt for voice cloning; null: none.")})
    voice_text_column: str | None = field(default=None, metadata={"help": (
        "The data-set column holding the transcript of each row's reference voice, in the speaker format "
        "(with voice_audio_column).")})
    guidance_scale: float = field(default=3.0, metadata={"help": (
        "Classifier-free guidance scale of every step (Dia's generation config: 3.0; 1: off, no "
        "unconditional pass). The log-probs are those of the guided scores the sampler draws from.")})
    temperature: float = field(default=1.8, metadata={"help": (
        "Sampling temperature (Dia's generation config: 1.8); at least 1, as transformers' Dia generation "
        "raises lower values to 1.")})
    top_k: int = field(default=50, metadata={"help": (
        "Top-k of every codebook token, also the guidance's top-k (Dia's generation config: 50; 0: off).")})
    top_p: float = field(default=0.9, metadata={"help": (
        "Nucleus sampling of every codebook token (Dia's generation config: 0.90; 1: off).")})
    max_new_frames: int = field(default=860, metadata={"help": (
        "The most audio frames a completion may have before its eos is forced (DAC at 44.1 kHz: 86 frames "
        "a second, so 860 is 10 s); the decoder runs max(delay_pattern) steps more to finish the delayed codebooks.")})
    mask_truncated: bool = field(default=False, metadata={"help": (
        "Completions cut at max_new_frames (eos forced) take no part in the loss (DAPO's overlong filtering).")})


@ADAPTERS.register("dia")
class DiaPolicy(ReferenceVoicePolicy):
    """Dia as a policy over delayed decoder steps (module docstring)."""

    Config = DiaPolicyConfig
    stage_fields = frozenset({"max_new_frames", "top_k", "top_p", "mask_truncated"})

    @classmethod
    def config_problems(cls, cfg: DiaPolicyConfig) -> list[str]:
        checks = [(not cfg.model, "policy.model must name a Dia model (hub id, local path, or tiny:NAME)"),
                  (cfg.dtype not in DTYPES, f"policy.dtype={cfg.dtype!r} is not one of {sorted(DTYPES)}"),
                  (cfg.guidance_scale < 1, f"policy.guidance_scale={cfg.guidance_scale} must be >= 1 (1: off)"),
                  (cfg.temperature < 1, f"policy.temperature={cfg.temperature} must be >= 1 (transformers' Dia "
                                        "generation raises a lower one to 1)"),
                  (cfg.top_k < 0, f"policy.top_k={cfg.top_k} must be >= 0 (0: off)"),
                  (not 0 < cfg.top_p <= 1, f"policy.top_p={cfg.top_p} must be in (0, 1]"),
                  (cfg.max_new_frames < 1, f"policy.max_new_frames={cfg.max_new_frames} must be at least 1"),
                  (cls.voice_columns_problem(cfg) is not None, cls.voice_columns_problem(cfg))]
        return [message for failed, message in checks if failed]

    @classmethod
    def memory_model(cls, cfg: DiaPolicyConfig, prompt_length: int) -> Any:
        """Refused by name: no formula of the project's (causal LM, CSM's none) covers Dia's shape."""
        raise UserError("mmrl plan: the adapter DiaPolicy has no memory formula yet (an encoder-decoder whose "
                        "every step runs twice under guidance, conditional and unconditional rows, over K codebook "
                        "heads; the causal-LM formula covers none of that); its memory is not planned")

    def __init__(self, cfg: DiaPolicyConfig):
        problems = self.config_problems(cfg)
        if problems:
            raise ValueError(problems[0])
        self.cfg = cfg
        if cfg.model.startswith("tiny:"):
            self.model, self.processor = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)
        else:
            from transformers import DiaForConditionalGeneration, DiaProcessor
            self.processor = DiaProcessor.from_pretrained(cfg.model)
            self.model = pretrained(DiaForConditionalGeneration, cfg.model, dtype=DTYPES[cfg.dtype])
        self.processor.audio_tokenizer.requires_grad_(False).eval()
        if cfg.device:
            self.model.to(cfg.device)
            self.processor.audio_tokenizer.to(cfg.device)
        self.prompts = DiaPrompts(self.processor, self.model.config, cfg)
        self.delays = list(self.model.config.delay_pattern)
        self.eos = self.model.config.decoder_config.eos_token_id
        self.pad = self.model.config.decoder_config.pad_token_id
        self.sampling_rate = self.processor.feature_extractor.sampling_rate

    @property
    def max_units(self) -> int:
        return self.cfg.max_new_frames + max(1, max(self.delays))

    def guided_scores(self, logits: Tensor, batch: int, ends: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Step scores [batch, K, V] from the model's logits [batch or 2 x batch, K, V] (conditional rows, then
        the unconditional ones under guidance), and channel 0's end decisions."""
        cfg = self.cfg
        cond, uncond = logits[:batch], (logits[batch:] if cfg.guidance_scale != 1 else None)
        return step_scores(cond, uncond, self.eos, cfg.guidance_scale, cfg.temperature, cfg.top_k, cfg.top_p, ends)

    # ----- rollouts ----------------------------------------------------------------------------
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int],
                greedy: bool = False) -> Rollout:
        """Each group drawn on its own from its seed (so it is the same in any batch), joined right-padded."""
        parts = [self._draw_group(row, group_size, seed, greedy) for row, seed in zip(prompts, seeds)]
        for g, part in enumerate(parts):
            part.group_id.fill_(g)
        return self.concat(parts)

    @torch.no_grad()
    def _draw_group(self, row: Any, group_size: int, seed: int, greedy: bool) -> Rollout:
        """`group_size` completions of one prompt, a step at a time with a KV cache (module docstring)."""
        prompt = self.prompts.of(row, str(self.prompt_of(row)))
        generator = torch.Generator(device=self.device).manual_seed(int(seed))
        ids, free, logp, ends, ended = draw_steps(self, prompt, group_size, generator, greedy)
        start = prompt.start
        units = ends - start + max(1, max(self.delays))
        unit_mask = (torch.arange(logp.shape[1])[None] < units[:, None]).float()
        if self.cfg.mask_truncated:
            unit_mask = unit_mask * ended[:, None]
        waves = [self.decode(frames_of(ids[i], start, int(ends[i]), self.delays)) for i in range(group_size)]
        text = prompt.text_ids.repeat(group_size, 1)
        return Rollout(group_id=torch.zeros(group_size, dtype=torch.long), prompts=[self.prompt_of(row)] * group_size,
                       completions=[{"array": w, "sampling_rate": self.sampling_rate} for w in waves],
                       unit_mask=unit_mask, truncated=~ended, columns={"ended": ended.tolist()},
                       extras={"text_ids": text, "text_mask": torch.ones_like(text), "decoder_ids": ids.cpu(),
                               "drawn": free.cpu(), "start": torch.full((group_size,), start, dtype=torch.long)},
                       rollout_logp=None if greedy else (logp.float().cpu() * unit_mask))

    @torch.no_grad()
    def decode(self, codes: Tensor) -> np.ndarray:
        """Float32 samples in [-1, 1] of audio frames [K, T] through the processor's DAC; no frames: no samples."""
        if codes.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        codec = self.processor.audio_tokenizer
        audio = codec.decode(audio_codes=codes[None].to(codec.device)).audio_values
        return audio.reshape(-1).float().clamp(-1, 1).cpu().numpy()

    def concat(self, parts: Sequence[Rollout]) -> Rollout:
        """Groups joined with their text, decoder positions and units padded on the right (Dia's encoder takes
        text right-padded, as its processor pads it)."""
        widths = {key: max(p.extras[key].shape[1] for p in parts) for key in ("text_ids", "decoder_ids")}
        units = max(p.num_units for p in parts)
        fixed = []
        for p in parts:
            extras = {**p.extras, **padded_right(p.extras, widths, self.pad)}
            logp = nn.functional.pad(p.rollout_logp, (0, units - p.num_units)) if p.rollout_logp is not None else None
            fixed.append(replace(p, unit_mask=nn.functional.pad(p.unit_mask, (0, units - p.num_units)),
                                 extras=extras, rollout_logp=logp))
        return Rollout.concat(fixed)

    # ----- log-probs ---------------------------------------------------------------------------
    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """fp32 log-probs [B, u] of the steps (dia_steps.py), from one guided pass over text and decoder positions."""
        width = used_width(batch.unit_mask)
        ex = {k: v.to(self.device) for k, v in batch.extras.items() if isinstance(v, Tensor)}
        start = ex["start"]
        last = int(start.max()) + width  # positions 0 .. last - 1 are read
        ids = ex["decoder_ids"][:, :last]
        text, mask = ex["text_ids"], ex["text_mask"]
        if self.cfg.guidance_scale != 1:  # the unconditional rows: zero text under the same mask, as Dia's generate
            text, mask, ids = torch.cat([text, torch.zeros_like(text)]), torch.cat([mask, mask]), torch.cat([ids, ids])
        logits = model(input_ids=text, attention_mask=mask, decoder_input_ids=ids[:, :-1]).logits
        rows, channels = len(start), len(self.delays)
        logits = logits.reshape(-1, channels, last - 1, logits.shape[-1]).transpose(1, 2)  # [2B, last-1, K, V]
        at = (start[:, None] + torch.arange(width, device=start.device)).clamp(max=last - 1)  # [B, width]
        reads = (at - 1).repeat(logits.shape[0] // rows, 1)
        step_logits = logits.gather(1, reads[..., None, None].expand(-1, -1, channels, logits.shape[-1]))
        tokens = ex["decoder_ids"].gather(1, at[..., None].expand(-1, -1, channels))  # [B, width, K]
        drawn = ex["drawn"].gather(1, at[..., None].expand(-1, -1, channels))
        ends = (tokens[..., 0] == self.eos).reshape(-1)  # channel 0's end decisions as drawn
        scores, _ = self.guided_scores(step_logits.reshape(-1, channels, step_logits.shape[-1]), rows * width, ends)
        logp, entropy = step_logprobs(scores, tokens.reshape(-1, channels), drawn.reshape(-1, channels), with_entropy)
        logp = logp.reshape(rows, width)
        entropy = entropy.reshape(rows, width) if entropy is not None else None
        return full_width(logp, entropy, batch.num_units, units)

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        """The model and its processor; a codec built in memory (a tiny model's) is saved beside them in
        ``dac/`` and the processor names that folder (a hub codec keeps its own name)."""
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
        codec = self.processor.audio_tokenizer
        if not codec.name_or_path:
            codec.save_pretrained(Path(path) / "dac")
            codec.name_or_path = str((Path(path) / "dac").resolve())
        self.processor.save_pretrained(path)
