"""Text-to-speech over codec tokens: Sesame's CSM (`CsmForConditionalGeneration`) as a policy whose
units are codec frames (`codec_frames.py`: a frame's log-prob is the chain rule over its codebooks).

A prompt is the text to say; it is written as CSM's processor writes a turn,
``<bos>[speaker]text<eos>``, after an optional reference voice (a turn of its transcript and clip,
`csm_prompts.py`), and the model continues with audio frames until it draws the end frame
(every codebook but the last at `codebook_eos_token_id`, as transformers' CSM generation stops) or
`max_new_frames`. The end frame is a unit (the decision to stop), and is not decoded. Rollouts are
decoded to waveforms by the model's own codec (Mimi), as {"array", "sampling_rate"} completions.
The codec is frozen: RL trains the backbone, its head and the depth decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS

from ..lm.rollout_batches import concat_padded, full_width, used_width
from ..model_loading import DTYPES, load_tiny, pretrained
from ..lm.audio_lm import load_audio
from .codec_frames import draw_frame, frame_logprobs
from .speech_policy import ReferenceVoicePolicy
from .csm_prompts import left_padded, prompt_embeddings, prompt_positions, turn_ids, voice_codes


@dataclass
class CSMConfig:
    model: str = field(default="", metadata={"help": (
        "Hub id or local path of a CSM checkpoint (e.g. sesame/csm-1b), or tiny:NAME for a tiny random model "
        "built from a config (tests, demos).")})
    tiny_args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments of the tiny model builder when model is tiny:NAME.")})
    dtype: str = field(default="float32", metadata={"help": (
        "Weights' dtype: float32, bfloat16 or float16 (log-probs are always computed in fp32)."),
        "choices": "mmrl.tasks.model_loading:DTYPES"})
    device: str | None = field(default=None, metadata={"help": (
        "Move the model to this device (e.g. cuda:0); null: leave placement to accelerate.")})
    speaker: str = field(default="0", metadata={"help": (
        "The speaker id written before the text, as CSM's processor writes a turn's role: [0]text.")})
    speaker_column: str | None = field(default=None, metadata={"help": (
        "A data-set column holding each row's speaker id (overrides speaker); null: speaker for every row.")})
    voice_audio_column: str | None = field(default=None, metadata={"help": (
        "A data-set column holding each row's reference voice (a path or {array, sampling_rate}): a turn of that "
        "clip and its transcript (voice_text_column) goes before the text to say, as CSM takes context; null: none.")})
    voice_text_column: str | None = field(default=None, metadata={"help": (
        "The data-set column holding the transcript of each row's reference voice (with voice_audio_column).")})
    temperature: float = field(default=0.9, metadata={"help": (
        "Sampling temperature of every codebook token (CSM's generation config: 0.9).")})
    top_k: int = field(default=50, metadata={"help": (
        "Top-k sampling of every codebook token (CSM's generation config: 50; 0: off). The log-probs are "
        "those of the truncated distribution the sampler draws from.")})
    max_new_frames: int = field(default=125, metadata={"help": (
        "The most codec frames a completion may have (Mimi: 12.5 frames a second, so 125 is 10 s).")})
    mask_truncated: bool = field(default=False, metadata={"help": (
        "Completions cut at max_new_frames (no end frame) take no part in the loss (DAPO's overlong filtering).")})


@ADAPTERS.register("csm")
class CSMPolicy(ReferenceVoicePolicy):
    """CSM as a policy over codec frames (module docstring)."""

    Config = CSMConfig
    stage_fields = frozenset({"max_new_frames", "top_k", "mask_truncated"})

    @classmethod
    def config_problems(cls, cfg: CSMConfig) -> list[str]:
        problems = []
        if not cfg.model:
            problems.append("policy.model must name a CSM model (hub id, local path, or tiny:NAME)")
        if cfg.dtype not in DTYPES:
            problems.append(f"policy.dtype={cfg.dtype!r} is not one of {sorted(DTYPES)}")
        if cfg.temperature <= 0:
            problems.append(f"policy.temperature={cfg.temperature} must be > 0")
        if cfg.top_k < 0:
            problems.append(f"policy.top_k={cfg.top_k} must be >= 0 (0: off)")
        if cfg.max_new_frames < 1:
            problems.append(f"policy.max_new_frames={cfg.max_new_frames} must be at least 1")
        if problem := cls.voice_columns_problem(cfg):
            problems.append(problem)
        return problems

    def __init__(self, cfg: CSMConfig):
        problems = self.config_problems(cfg)
        if problems:
            raise ValueError(problems[0])
        self.cfg = cfg
        if cfg.model.startswith("tiny:"):
            self.model, self.tokenizer = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)
        else:  # the text tokenizer alone: prompts are text (CsmProcessor's feature extractor reads reference audio)
            from transformers import AutoTokenizer, CsmForConditionalGeneration
            self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
            self.model = pretrained(CsmForConditionalGeneration, cfg.model, dtype=DTYPES[cfg.dtype])
        self.model.codec_model.requires_grad_(False).eval()
        if cfg.device:
            self.model.to(cfg.device)
        config = self.model.config
        self.num_codebooks = config.num_codebooks
        self.allowed = config.codec_config.codebook_size  # ids the codec decodes (the rest: eos / pad markers)
        self.sampling_rate = config.codec_config.sampling_rate
        bos = self.tokenizer.bos_token_id
        self._bos = bos if bos is not None else config.bos_token_id

    @property
    def max_units(self) -> int:
        return self.cfg.max_new_frames

    # ----- prompts ---------------------------------------------------------------------------
    def prompt_ids(self, row: Any) -> list[int]:
        """The token ids of the turn to be spoken, as CSM's chat template writes it: bos, [speaker]text, eos."""
        return turn_ids(self.tokenizer, self._bos, self._speaker(row), str(self.prompt_of(row)))

    def _speaker(self, row: Any) -> Any:
        speaker = row.get(self.cfg.speaker_column) if self.cfg.speaker_column and isinstance(row, dict) else None
        return self.cfg.speaker if speaker is None else speaker

    def _voice(self, row: Any) -> tuple[list[int], Tensor] | None:
        """The reference voice's turn ids and its clip's codes [K, n], or None."""
        if not self.cfg.voice_audio_column or not isinstance(row, dict):
            return None
        samples = load_audio(row[self.cfg.voice_audio_column], self.sampling_rate)
        ids = turn_ids(self.tokenizer, self._bos, self._speaker(row), str(row[self.cfg.voice_text_column]))
        return ids, voice_codes(self.model, samples)

    def _prompt_tensors(self, rows: Sequence[Any]) -> dict[str, Tensor]:
        """Left-padded `prompt_ids`, `prompt_mask` [P, L] and `prompt_codes` [P, K, L] (csm_prompts.py)."""
        positions = [prompt_positions(self.model, self.prompt_ids(r), self._voice(r)) for r in rows]
        return left_padded(positions, self.model.config.pad_token_id)

    # ----- the backbone ------------------------------------------------------------------------
    def _hidden_states(self, model: nn.Module, extras: dict[str, Tensor], width: int) -> Tensor:
        """Backbone hidden states [B, width, H] at the position before each of the first `width` frames."""
        core = csm_modules(model)
        prompt_ids, prompt_mask = extras["prompt_ids"].to(self.device), extras["prompt_mask"].to(self.device)
        codes = extras["completion_codes"][:, :, :width - 1].to(self.device)
        frame_mask = torch.ones(codes.shape[0], codes.shape[2], dtype=prompt_mask.dtype, device=self.device)
        prompt = prompt_embeddings(core, prompt_ids, extras["prompt_codes"].to(self.device))
        embeds = torch.cat([prompt, core.backbone_model.embed_tokens(codes.transpose(1, 2))], 1)
        attention = torch.cat([prompt_mask, frame_mask], dim=1)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        hidden = core.backbone_model(inputs_embeds=embeds, attention_mask=attention, position_ids=positions,
                                     use_cache=False).last_hidden_state
        return hidden[:, prompt_ids.shape[1] - 1:]

    # ----- rollouts ----------------------------------------------------------------------------
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int],
                greedy: bool = False) -> Rollout:
        """Each group drawn on its own from its seed (so it is the same in any batch), joined padded."""
        parts = [self._draw_group(row, group_size, seed, greedy) for row, seed in zip(prompts, seeds)]
        for g, part in enumerate(parts):
            part.group_id.fill_(g)
        return self.concat(parts)

    @torch.no_grad()
    def _draw_group(self, row: Any, group_size: int, seed: int, greedy: bool) -> Rollout:
        """`group_size` completions of one prompt: frames drawn one at a time with a KV cache."""
        from transformers import DynamicCache
        model, cfg = self.model, self.cfg
        generator = torch.Generator(device=self.device).manual_seed(int(seed))
        prompt = {k: v.repeat(group_size, *[1] * (v.dim() - 1)) for k, v in self._prompt_tensors([row]).items()}
        cache = DynamicCache(config=model.config)
        embeds = prompt_embeddings(model, prompt["prompt_ids"].to(self.device), prompt["prompt_codes"].to(self.device))
        frames, logps = [], []
        done = torch.zeros(group_size, dtype=torch.bool, device=self.device)
        ends = torch.full((group_size,), cfg.max_new_frames, dtype=torch.long)
        for t in range(cfg.max_new_frames):
            out = model.backbone_model(inputs_embeds=embeds, cache=cache, use_cache=True)
            cache = out.cache
            codes, logp = draw_frame(model.lm_head, model.depth_decoder, out.last_hidden_state[:, -1],
                                     self.num_codebooks, cfg.temperature, cfg.top_k, self.allowed, generator, greedy)
            frames.append(codes)
            logps.append(logp)
            is_end = (codes[:, :-1] == model.config.codebook_eos_token_id).all(-1) & ~done
            ends[is_end.cpu()] = t + 1
            done |= is_end
            if done.all():
                break
            embeds = model.backbone_model.embed_tokens(codes[:, None, :])
        return self._group_rollout(row, prompt, torch.stack(frames, 2), torch.stack(logps, 1), ends, done.cpu(), greedy)

    def _group_rollout(self, row: Any, prompt: dict[str, Tensor], codes: Tensor, logp: Tensor,
                       ends: Tensor, ended: Tensor, greedy: bool) -> Rollout:
        """The record of one group: its prompt tensors, codes [G, K, T], frame log-probs [G, T], each row's
        unit count `ends` [G]."""
        width = codes.shape[2]
        unit_mask = (torch.arange(width)[None] < ends[:, None]).float()
        if self.cfg.mask_truncated:
            unit_mask = unit_mask * ended[:, None]
        waves = [self.decode(codes[i, :, :int(ends[i]) - int(ended[i])]) for i in range(len(ends))]
        return Rollout(group_id=torch.zeros(len(ends), dtype=torch.long), prompts=[self.prompt_of(row)] * len(ends),
                       completions=[{"array": w, "sampling_rate": self.sampling_rate} for w in waves],
                       unit_mask=unit_mask, truncated=~ended, columns={"ended": ended.tolist()},
                       extras={**prompt, "completion_codes": codes.cpu()},
                       rollout_logp=None if greedy else (logp.float().cpu() * unit_mask))

    @torch.no_grad()
    def decode(self, codes: Tensor) -> np.ndarray:
        """Float32 samples in [-1, 1] of codec frames [K, T] through the model's codec (Mimi's
        `decode`); an empty completion is silence of no samples."""
        if codes.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        audio = self.model.codec_model.decode(codes[None].to(self.device)).audio_values
        return audio.reshape(-1).float().clamp(-1, 1).cpu().numpy()

    def concat(self, parts: Sequence[Rollout]) -> Rollout:
        return concat_padded(parts, self.model.config.pad_token_id)

    # ----- log-probs ---------------------------------------------------------------------------
    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """fp32 log-probs [B, u] of the frames (codec_frames.py), from one backbone pass over prompt and frames."""
        core = csm_modules(model)
        width = used_width(batch.unit_mask)
        hidden = self._hidden_states(model, batch.extras, width)
        codes = batch.extras["completion_codes"][:, :, :width].to(self.device).transpose(1, 2)
        logp, entropy = frame_logprobs(core.lm_head, core.depth_decoder, hidden, codes, self.cfg.temperature,
                                       self.cfg.top_k, self.allowed, with_entropy)
        return full_width(logp, entropy, batch.num_units, units)

    def supervised_loss(self, model: nn.Module, rows: Sequence[dict], target_column: str) -> Tensor:
        """Mean negative log-likelihood per frame of each row's target audio (`target_column`: a path or
        {array, sampling_rate}) encoded by the model's codec, then the end frame (every codebook at
        `codebook_eos_token_id`), given its prompt; the model's own distribution (temperature 1, no top-k)."""
        core = csm_modules(model)
        end = torch.full((self.num_codebooks, 1), core.config.codebook_eos_token_id, dtype=torch.long)
        targets = [torch.cat([voice_codes(core, load_audio(r[target_column], self.sampling_rate)), end], 1)
                   for r in rows]
        width = max(t.shape[1] for t in targets)
        codes = torch.zeros(len(rows), self.num_codebooks, width, dtype=torch.long)
        mask = torch.zeros(len(rows), width)
        for i, t in enumerate(targets):
            codes[i, :, :t.shape[1]], mask[i, :t.shape[1]] = t, 1.0
        hidden = self._hidden_states(model, {**self._prompt_tensors(rows), "completion_codes": codes}, width)
        logp, _ = frame_logprobs(core.lm_head, core.depth_decoder, hidden, codes.transpose(1, 2).to(self.device),
                                 1.0, 0, self.allowed)
        mask = mask.to(logp.device)
        return -(logp * mask).sum() / mask.sum()

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
        self.tokenizer.save_pretrained(path)


def csm_modules(model: nn.Module) -> nn.Module:
    """The CSM model whose parts (text embeddings, backbone, head, depth decoder) the log-probs call: `model`,
    or the base model under a LoRA adapter. A model wrapped for distribution is refused: the parts are
    called outside the wrapper's own forward, so the adapter trains on one process for now."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not hasattr(core, "depth_decoder"):
        raise UserError(f"task csm: the model comes wrapped as {type(model).__name__}; the csm adapter calls the "
                        "model's parts outside the wrapper's forward and trains on one process only for now")
    return core
