"""Text-to-speech with Qwen2.5-Omni's talker (`Qwen2_5OmniForConditionalGeneration`) as a policy whose units are its
single-codebook codec tokens, one causal-LM unit each.

A prompt is the text to say. As text-to-speech with an Omni model is done, the thinker is asked to say it and its
reply is the text itself, teacher-forced: the conversation (an optional system prompt, a user turn of the text, the
assistant's generation prompt) and then the text's tokens and the thinker's end token go through the frozen thinker
once, and its states of that reply feed the talker exactly as the stock `generate` hands a generated reply over
(`omni_talker_inputs.py`). The talker draws codec tokens with the stock talker generation's logits processors until
it draws one of its end ids (codec pad or codec end, the stock `talker_eos_token_id`) or `max_new_tokens`; the end
token is a unit (the decision to stop) and is not decoded. Rollouts are decoded by the model's token2wav (a DiT flow
model from the speaker's conditioning, then BigVGAN) into {"array", "sampling_rate"} completions. The thinker and
token2wav are frozen: RL trains the talker.
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
from .speech_policy import SpeechPolicy
from .omni_talker_inputs import (prefill_embeds, prefix_codes, processed_logits, seen_ids, talker_logits,
                                 thinker_states)

QWEN_OMNI_SYSTEM = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
                    "auditory and visual inputs, as well as generating text and speech.")
SAMPLE_RATE = 24000  # token2wav's BigVGAN output rate (Qwen2.5-Omni's processor and model card)


@dataclass
class OmniTalkerConfig:
    model: str = field(default="", metadata={"help": (
        "Hub id or local path of a Qwen2.5-Omni checkpoint with its talker (e.g. Qwen/Qwen2.5-Omni-7B), or tiny:NAME "
        "for a tiny random model built from a config (tests, demos).")})
    tiny_args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments of the tiny model builder when model is tiny:NAME.")})
    dtype: str = field(default="float32", metadata={"help": (
        "Thinker and talker weights' dtype: float32, bfloat16 or float16 (token2wav stays float32, as the stock model "
        "keeps it; log-probs are always computed in fp32)."), "choices": "mmrl.tasks.model_loading:DTYPES"})
    device: str | None = field(default=None, metadata={"help": (
        "Move the model to this device (e.g. cuda:0); null: leave placement to accelerate.")})
    speaker: str = field(default="Chelsie", metadata={"help": (
        "The voice: a key of the checkpoint's spk_dict.pt (Qwen2.5-Omni: Chelsie, Ethan), giving the talker's text-bos "
        "token and token2wav's conditioning, as the stock generate's speaker argument.")})
    system_prompt: str = field(default=QWEN_OMNI_SYSTEM, metadata={"help": (
        "The thinker's system turn before the text to say (Qwen2.5-Omni's model card: this prompt for speech output); "
        "empty: none.")})
    temperature: float = field(default=0.9, metadata={"help": (
        "Sampling temperature of the codec tokens (the stock generate's talker_temperature: 0.9).")})
    top_k: int = field(default=40, metadata={"help": (
        "Top-k of the codec tokens (talker_top_k: 40; 0: off). Log-probs are those of the truncated distribution.")})
    top_p: float = field(default=0.8, metadata={"help": (
        "Top-p nucleus of the codec tokens (talker_top_p: 0.8; 1: off), after top-k, as transformers' warpers.")})
    repetition_penalty: float = field(default=1.05, metadata={"help": (
        "Repetition penalty over the codec ids drawn so far and the prefix's (talker_repetition_penalty: 1.05; 1: off), "
        "applied before the temperature, in the sampler and in the log-probs alike.")})
    max_new_tokens: int = field(default=600, metadata={"help": (
        "The most codec tokens a completion may have (Qwen2.5-Omni: 50 a second, so 600 is 12 s; stock: 4096).")})
    mask_truncated: bool = field(default=False, metadata={"help": (
        "Completions cut at max_new_tokens (no end token) take no part in the loss (DAPO's overlong filtering).")})


@ADAPTERS.register("omni_talker")
class OmniTalkerPolicy(SpeechPolicy):
    """Qwen2.5-Omni's talker as a policy over codec tokens (module docstring)."""

    Config = OmniTalkerConfig
    stage_fields = frozenset({"max_new_tokens", "top_k", "top_p", "mask_truncated"})

    @classmethod
    def config_problems(cls, cfg: OmniTalkerConfig) -> list[str]:
        checks = [(not cfg.model, "policy.model must name a Qwen2.5-Omni model (hub id, local path, or tiny:NAME)"),
                  (cfg.dtype not in DTYPES, f"policy.dtype={cfg.dtype!r} is not one of {sorted(DTYPES)}"),
                  (cfg.temperature <= 0, f"policy.temperature={cfg.temperature} must be > 0"),
                  (cfg.top_k < 0, f"policy.top_k={cfg.top_k} must be >= 0 (0: off)"),
                  (not 0 < cfg.top_p <= 1, f"policy.top_p={cfg.top_p} must be in (0, 1] (1: off)"),
                  (cfg.repetition_penalty <= 0, f"policy.repetition_penalty={cfg.repetition_penalty} must be > 0"),
                  (cfg.max_new_tokens < 1, f"policy.max_new_tokens={cfg.max_new_tokens} must be at least 1")]
        return [message for failed, message in checks if failed]

    @classmethod
    def prompt_check(cls, cfg: OmniTalkerConfig):
        """A prompt is the text to say, the thinker's reply: a string with something in it."""
        def check(prompt: Any) -> str | None:
            if not isinstance(prompt, str):
                return f"a {type(prompt).__name__} prompt: task omni_talker takes the text to say"
            return None if prompt.strip() else "an empty prompt: task omni_talker needs text to say"
        return check

    def __init__(self, cfg: OmniTalkerConfig):
        problems = self.config_problems(cfg)
        if problems:
            raise ValueError(problems[0])
        self.cfg = cfg
        if cfg.model.startswith("tiny:"):
            self.model, self.tokenizer = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)
        else:
            from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration
            self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
            self.model = pretrained(Qwen2_5OmniForConditionalGeneration, cfg.model, dtype=DTYPES[cfg.dtype])
        if not getattr(self.model, "has_talker", False):
            raise UserError(f"policy.model={cfg.model!r}: the checkpoint has no talker (enable_audio_output is off)")
        if cfg.speaker not in self.model.speaker_map:
            raise UserError(f"policy.speaker={cfg.speaker!r} is not a voice of {cfg.model!r}: "
                            f"{sorted(self.model.speaker_map)}")
        self.model.thinker.requires_grad_(False).eval()
        self.model.token2wav.requires_grad_(False).eval().float()
        if cfg.device:
            self.model.to(cfg.device)
        talker = self.model.talker
        self.end_ids = [talker.codec_pad_token, talker.codec_eos_token]
        self.vocab = talker.config.vocab_size
        self._reply_end = self.model.thinker.generation_config.eos_token_id
        if isinstance(self._reply_end, list):
            self._reply_end = self._reply_end[0]

    @property
    def max_units(self) -> int:
        return self.cfg.max_new_tokens

    # ----- prompts ---------------------------------------------------------------------------
    def prompt_ids(self, row: Any) -> list[int]:
        """The thinker's prompt: the system turn (if any), a user turn of the text, the assistant's generation prompt."""
        messages = [{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []
        messages.append({"role": "user", "content": str(self.prompt_of(row))})
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False))

    def reply_ids(self, row: Any) -> list[int]:
        """The reply teacher-forced through the thinker: the text's tokens, then the thinker's end token."""
        return [*self.tokenizer(str(self.prompt_of(row)), add_special_tokens=False)["input_ids"], self._reply_end]

    def _states(self, row: Any) -> tuple[Tensor, Tensor]:
        bos = self.model.speaker_map[self.cfg.speaker]["bos_token"]
        return thinker_states(self.model, self.prompt_ids(row), self.reply_ids(row), bos)

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
        """`group_size` completions of one prompt, codec tokens drawn one at a time with a KV cache."""
        from transformers import DynamicCache
        talker, cfg = self.model.talker, self.cfg
        generator = torch.Generator(device=self.device).manual_seed(int(seed))
        prefill, stream = self._states(row)
        prefix = torch.tensor([prefix_codes(talker, len(prefill))] * group_size, device=self.device)
        embeds = prefill_embeds(talker, prefill[None].expand(group_size, -1, -1), prefix)
        seen = torch.zeros(group_size, self.vocab, dtype=torch.bool, device=self.device).scatter(1, prefix, True)
        cache, codes, logps = DynamicCache(config=talker.config), [], []
        done = torch.zeros(group_size, dtype=torch.bool, device=self.device)
        ends = torch.full((group_size,), cfg.max_new_tokens, dtype=torch.long)
        for t in range(cfg.max_new_tokens):
            logits, out = talker_logits(talker, embeds, cache=cache, use_cache=True)
            cache = out.cache
            scores = processed_logits(logits[:, -1], seen, talker.codec_bos_token, cfg.repetition_penalty,
                                      cfg.temperature, cfg.top_k, cfg.top_p, sampling=not greedy)
            logp = torch.log_softmax(scores, -1)
            code = scores.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
            codes.append(code)
            logps.append(logp.gather(-1, code[:, None])[:, 0])
            is_end = torch.isin(code, torch.tensor(self.end_ids, device=code.device)) & ~done
            ends[is_end.cpu()] = t + 1
            done |= is_end
            if done.all():
                break
            seen = seen.scatter(1, code[:, None], True)
            entry = stream[min(t, len(stream) - 1)].to(embeds.dtype)
            embeds = (talker.get_input_embeddings()(code) + entry)[:, None]
        codes = torch.stack(codes, 1).cpu()
        return self._group_rollout(row, seed, prefix.cpu(), prefill, stream, codes, torch.stack(logps, 1), ends,
                                   done.cpu(), greedy)

    def _group_rollout(self, row: Any, seed: int, prefix: Tensor, prefill: Tensor, stream: Tensor, codes: Tensor,
                       logp: Tensor, ends: Tensor, ended: Tensor, greedy: bool) -> Rollout:
        """The record of one group: the talker's prefix codec ids [G, L] and prefill [G, E, L] (as prompt tensors),
        its thinker stream (a list of [R, E]), codes [G, T], log-probs [G, T], each row's unit count `ends` [G]."""
        group = len(ends)
        unit_mask = (torch.arange(codes.shape[1])[None] < ends[:, None]).float()
        if self.cfg.mask_truncated:
            unit_mask = unit_mask * ended[:, None]
        waves = [self.decode(codes[i, :int(ends[i]) - int(ended[i])], seed) for i in range(group)]
        extras = {"prompt_ids": prefix, "prompt_mask": torch.ones_like(prefix),
                  "prompt_embeds": prefill.T.float().cpu()[None].repeat(group, 1, 1),
                  "reply_stream": [stream.float().cpu()] * group, "completion_codes": codes}
        return Rollout(group_id=torch.zeros(group, dtype=torch.long), prompts=[self.prompt_of(row)] * group,
                       completions=[{"array": w, "sampling_rate": SAMPLE_RATE} for w in waves],
                       unit_mask=unit_mask, truncated=~ended, columns={"ended": ended.tolist()}, extras=extras,
                       rollout_logp=None if greedy else (logp.float().cpu() * unit_mask))

    @torch.no_grad()
    def decode(self, codes: Tensor, seed: int) -> np.ndarray:
        """Float32 samples in [-1, 1] of codec tokens [T] through token2wav with the speaker's conditioning, its DiT
        starting from noise drawn from `seed` (so a waveform is a function of its codes and seed); no codes: no
        samples."""
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        speaker = self.model.speaker_map[self.cfg.speaker]
        device = self.model.token2wav.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(int(seed))
            wave = self.model.token2wav(codes[None].to(device), conditioning=speaker["cond"].to(device).float(),
                                        reference_mel=speaker["ref_mel"].to(device).float())
        return wave.reshape(-1).float().clamp(-1, 1).cpu().numpy()

    def concat(self, parts: Sequence[Rollout]) -> Rollout:
        return concat_padded(parts, self.model.talker.codec_mask_token)

    # ----- log-probs ---------------------------------------------------------------------------
    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """fp32 log-probs [B, u] of the codec tokens under the processed logits (omni_talker_inputs.py), from one
        talker pass over prefill and codes."""
        talker, cfg = talker_module(model), self.cfg
        width = used_width(batch.unit_mask)
        prefix, mask = batch.extras["prompt_ids"].to(self.device), batch.extras["prompt_mask"].to(self.device)
        codes = batch.extras["completion_codes"][:, :width].to(self.device)
        prefill = prefill_embeds(talker, batch.extras["prompt_embeds"].to(self.device).transpose(1, 2), prefix)
        steps = torch.arange(width - 1)
        stream = torch.stack([s[steps.clamp(max=len(s) - 1)] for s in batch.extras["reply_stream"]]).to(self.device)
        embeds = torch.cat([prefill, talker.get_input_embeddings()(codes[:, :-1]) + stream.to(prefill.dtype)], 1)
        attention = torch.cat([mask, torch.ones_like(codes[:, :-1])], 1)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        logits, _ = talker_logits(talker, embeds, attention_mask=attention, position_ids=positions, use_cache=False)
        scores = processed_logits(logits[:, prefix.shape[1] - 1:], seen_ids(prefix, codes, self.vocab),
                                  talker.codec_bos_token, cfg.repetition_penalty, cfg.temperature, cfg.top_k,
                                  cfg.top_p, sampling=True)
        logp_all = torch.log_softmax(scores, -1)
        logp = logp_all.gather(-1, codes[..., None])[..., 0]
        entropy = None
        if with_entropy:
            probs = logp_all.exp()
            entropy = -(probs * logp_all.masked_fill(probs == 0, 0.0)).sum(-1)
        return full_width(logp, entropy, batch.num_units, units)

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        """The whole model (as Qwen2_5OmniForConditionalGeneration.from_pretrained reads it, with its voices in
        spk_dict.pt) and the tokenizer."""
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        torch.save(talker_owner(model).speaker_map, Path(path) / "spk_dict.pt")


def talker_owner(model: nn.Module) -> nn.Module:
    """The Qwen2.5-Omni model under a LoRA adapter, or `model` itself. A model wrapped for distribution is refused:
    the talker's parts are called outside the wrapper's forward, so the adapter trains on one process for now."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not hasattr(core, "talker"):
        raise UserError(f"task omni_talker: the model comes wrapped as {type(model).__name__}; the omni_talker "
                        "adapter calls the talker's parts outside the wrapper's forward and trains on one process only "
                        "for now")
    return core


def talker_module(model: nn.Module) -> nn.Module:
    """The talker (`Qwen2_5OmniTalkerForConditionalGeneration`) whose parts the log-probs call."""
    return talker_owner(model).talker
