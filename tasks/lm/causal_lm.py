"""Autoregressive language models as policies: one unit per completion token.

Any ``AutoModelForCausalLM`` with its tokenizer (and chat template for message-list prompts).
Generation runs HF ``generate`` with the KV cache; sampling is done by `GroupSeededSampler`, so
a group's completions depend on its prompt and seed only, not on which other groups share the
batch or the process. Log-probs of completion tokens are fp32, at the sampling temperature with
the never-sampled tokens banned as the sampler bans them, computed by `selective_log_softmax` on
the completion positions only; the sampler records its own (`Rollout.rollout_logp`).

With `shared_prefill` (the default), each prompt is prefilled once, its media encoded once, and
its KV cache repeated for the G rows of its group before sampling, instead of prefilling G
identical copies; the samples are the same either way.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import Cache, DynamicLayer, LinearAttentionCacheLayerMixin

from mmrl.policy import Policy
from mmrl.registry import ADAPTERS
from mmrl.rollout import Rollout, take_rows

from ..model_loading import DTYPES, load_tiny, load_tokenizer, pad_on_the_left
from .chat_prompts import prompt_text, tokenize_prompts
from .prefix_sharing import SharedLayout, completion_lengths, prompt_groups, unsupported_reason, worth_sharing
from .rollout_batches import concat_padded, eos_token_ids, first_eos_ends, full_width, units_before, used_width
from .token_logprobs import selective_log_softmax
from .vllm_engine import VLLMConfig, VLLMEngine
from .vllm_engine import config_problems as vllm_config_problems

logger = logging.getLogger(__name__)


@dataclass
class CausalLMConfig:
    model: str = field(default="", metadata={"help": (
        "Hub id or local path of the model, or tiny:NAME for a tiny random model built from a config (tests, "
        "demos).")})
    tokenizer: str | None = field(default=None, metadata={"help": (
        "Hub id or path of the tokenizer; null: the model's.")})
    tiny_args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments of the tiny model builder when model is tiny:NAME (hidden, layers, seed, ...).")})
    dtype: str = field(default="float32", metadata={"help": (
        "Weights' dtype: float32, bfloat16 or float16 (log-probs are always computed in fp32)."),
        "choices": "tasks.model_loading:DTYPES"})
    device: str | None = field(default=None, metadata={"help": (
        "Move the model to this device (e.g. cuda:0); null: leave placement to accelerate.")})
    attn_implementation: str | None = field(default=None, metadata={"help": (
        "transformers' attention implementation (sdpa, eager, flash_attention_2); null: transformers' default. "
        "Prefix sharing needs sdpa or eager.")})
    trust_remote_code: bool = field(default=False, metadata={"help": (
        "Allow the model's own code from the hub (transformers' trust_remote_code).")})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of rollouts."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold of rollouts (1: off)."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling of rollouts (0: off)."})
    max_new_tokens: int = field(default=128, metadata={"help": (
        "The most tokens a completion may have; longer ones are truncated (and Dr. GRPO's constant normaliser).")})
    min_new_tokens: int = field(default=0, metadata={"help": (
        "The fewest tokens a completion must have (EOS suppressed before).")})
    stop_strings: list[str] = field(default_factory=list, metadata={"help": (
        "Strings that end a completion (it keeps the stop string); both rollout engines (hf, vllm) stop "
        "sampling there.")})
    chat_template: bool | None = field(default=None, metadata={"help": (
        "Apply the tokenizer's chat template: true (a string prompt becomes the user's message), false (prompts "
        "must be strings), null (only for prompts given as message lists).")})
    system_prompt: str | None = field(default=None, metadata={"help": (
        "A system message put first when the chat template is applied.")})
    mask_truncated: bool = field(default=False, metadata={"help": (
        "Truncated completions (no EOS within max_new_tokens) take no part in the loss (DAPO's overlong "
        "filtering).")})
    gradient_checkpointing: bool = field(default=False, metadata={"help": (
        "Recompute activations in backward to save memory.")})
    logprob_chunk_rows: int = field(default=1024, metadata={"help": (
        "Logit rows per chunk of the fp32 log-softmax over the vocabulary, so the full fp32 logits of a "
        "micro-batch are never held at once (memory bound, not a numeric setting).")})
    # log-prob passes run each group's prompt once (prefix_sharing.py); YAML's on/off are
    # booleans, so true / false mean on / off
    prefix_sharing: Literal["auto", "on", "off"] | bool = field(default="auto", metadata={"help": (
        "Log-prob passes run each group's prompt once, as [prompt; completion_1; ...] under a 4D mask (Prefix "
        "Grouper): on, off, or auto (when it at least halves the tokens). Same log-probs and gradients.")})
    shared_prefill: bool = field(default=True, metadata={"help": (
        "Rollouts prefill each prompt once and repeat its KV cache for the group's G samples (same samples as G "
        "prefills).")})
    rollout_engine: Literal["hf", "vllm"] = field(default="hf", metadata={"help": (
        "What samples rollouts: hf (transformers generate) or vllm (a colocated vLLM engine, sent the weights "
        "after every optimizer step; see policy.vllm and the README's vLLM section).")})
    vllm: VLLMConfig = field(default_factory=VLLMConfig, metadata={"help": (
        "The vLLM engine's settings when rollout_engine is vllm.")})


@lru_cache(maxsize=None)
def _log_once(message: str) -> None:
    """Log `message` as a warning the first time this process sees it."""
    logger.warning(message)


class GroupSeededSampler(LogitsProcessor):
    """Temperature / top-k / top-p sampling by inverse CDF, one uniform per row per step drawn
    from the row's group generator. Returns scores that are +inf at the drawn token, so greedy
    decoding in ``generate`` emits the sample.

    `logps` collects, per step, the fp32 log-prob [N] of the drawn token under the distribution it
    was drawn from: the scores as ``generate`` processed them (token bans, min_new_tokens' EOS ban)
    divided by the temperature, restricted to the top-k / top-p set and renormalised there."""

    def __init__(self, seeds: Sequence[int], group_size: int, temperature: float, top_k: int, top_p: float):
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.group_size = group_size
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.logps: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        logits = scores.float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        if self.top_k > 0:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > self.top_p
            probs = probs.scatter(1, order, sorted_p.masked_fill(drop, 0.0))
        u = torch.cat([torch.rand(self.group_size, generator=g) for g in self.generators]).to(probs.device)
        cdf = probs.cumsum(-1)
        total = cdf[:, -1:]
        token = torch.searchsorted(cdf, u[:, None] * total, right=True).clamp(max=probs.shape[-1] - 1)
        # a token of zero probability is never drawn (u * total can equal a cdf plateau's value)
        kept = logits.masked_fill(probs == 0, float("-inf"))  # the top-k / top-p set (and the bans)
        self.logps.append(torch.log_softmax(kept, dim=-1).gather(1, token).squeeze(1).cpu())
        return scores.scatter(1, token, float("inf"))

    def sampled_logp(self, width: int) -> Tensor:
        """The drawn tokens' log-probs [N, width] (steps after the last one are 0)."""
        logp = torch.stack(self.logps, 1) if self.logps else torch.zeros(self.group_size * len(self.generators), 0)
        return nn.functional.pad(logp, (0, width - logp.shape[1]))


@ADAPTERS.register("causal_lm")
class CausalLMPolicy(Policy):
    Config = CausalLMConfig
    # read at each rollout / log-prob pass, so a training stage may change them
    stage_fields = frozenset({"max_new_tokens", "min_new_tokens", "top_p", "top_k", "stop_strings",
                              "mask_truncated"})
    rollout_engines = ("hf", "vllm")  # what `policy.rollout_engine` may name for this adapter

    @classmethod
    def config_problems(cls, cfg: CausalLMConfig) -> list[str]:
        problems = []
        if not cfg.model:
            problems.append("policy.model must name a model (hub id, local path, or tiny:NAME)")
        if cfg.dtype not in DTYPES:
            problems.append(f"policy.dtype={cfg.dtype!r} is not one of {sorted(DTYPES)}")
        if cfg.temperature <= 0:
            problems.append(f"policy.temperature={cfg.temperature} must be > 0")
        if cfg.prefix_sharing not in ("auto", "on", "off", True, False):
            problems.append(f"policy.prefix_sharing={cfg.prefix_sharing!r} is not one of auto, on, off")
        if cfg.rollout_engine not in cls.rollout_engines:
            problems.append(f"policy.rollout_engine={cfg.rollout_engine!r}: the {cls.__name__} adapter supports "
                            f"{', '.join(cls.rollout_engines)}")
        elif cfg.rollout_engine == "vllm":
            problems.extend(vllm_config_problems(cfg.vllm))
        return problems

    def __init__(self, cfg: CausalLMConfig):
        problems = self.config_problems(cfg)
        if problems:
            raise ValueError(problems[0])
        if isinstance(cfg.prefix_sharing, bool):
            cfg.prefix_sharing = "on" if cfg.prefix_sharing else "off"
        self.cfg = cfg
        self._vllm: VLLMEngine | None = None  # built on the first rollout with rollout_engine vllm
        self._load(cfg)
        pad_on_the_left(self.tokenizer)
        if cfg.device:
            self.model.to(cfg.device)
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            self.model.config.use_cache = False

    @property
    def rollout_runs_model(self) -> bool:
        return self.cfg.rollout_engine == "hf"  # vllm: the engine holds its own copy of the weights

    def _load(self, cfg: CausalLMConfig) -> None:
        """Set `model` and `tokenizer`: a registered tiny model, or `from_pretrained`."""
        if cfg.model.startswith("tiny:"):
            self.model, self.tokenizer = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)
            return
        self.tokenizer = load_tokenizer(cfg)
        self.model = AutoModelForCausalLM.from_pretrained(
            cfg.model, dtype=DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation,
            trust_remote_code=cfg.trust_remote_code)

    @property
    def max_units(self) -> int:
        return self.cfg.max_new_tokens

    def suppressed_tokens(self) -> list[int]:
        """Token ids never sampled (a text model: none)."""
        return []

    # ----- prompts -------------------------------------------------------------------------
    def prompt_text(self, prompt: Any) -> str:
        """A string prompt as is; a list of chat messages through the chat template."""
        return prompt_text(self.tokenizer, prompt, self.cfg.chat_template, self.cfg.system_prompt)

    def _encode_prompts(self, prompts: Sequence[Any]) -> dict[str, Any]:
        """Per-prompt model inputs: left-padded `prompt_ids` / `prompt_mask` (keys starting with
        `prompt_` are [P, L] tensors padded on the left), plus adapter-specific entries."""
        return self._encode_parts(self._prompt_parts(prompts))

    def _prompt_parts(self, prompts: Sequence[Any]) -> list:
        """What encoding a prompt and sending it to vLLM both start from, prepared once per rollout:
        its text (an adapter with media: its chat text and decoded media)."""
        return [self.prompt_text(self.prompt_of(p)) for p in prompts]

    def _encode_parts(self, parts: list) -> dict[str, Any]:
        """`_encode_prompts` from the prompts' `_prompt_parts`."""
        ids, mask = tokenize_prompts(self.tokenizer, parts)
        return {"prompt_ids": ids, "prompt_mask": mask}

    @staticmethod
    def _expand(enc: dict[str, Any], group_size: int) -> dict[str, Any]:
        """Per-row inputs: every prompt's entry repeated for its `group_size` rows (tensors by
        repeat_interleave, per-prompt lists by reference, without copying)."""
        out = {}
        for key, value in enc.items():
            if isinstance(value, Tensor):
                out[key] = value.repeat_interleave(group_size, dim=0)
            else:
                out[key] = [v for v in value for _ in range(group_size)]
        return out

    def _model_inputs(self, rows: dict[str, Any], completion_ids: Tensor | None = None,
                      completion_mask: Tensor | None = None) -> dict[str, Tensor]:
        """Keyword inputs of `generate` (prompt only) or of the forward (prompt + completion)."""
        device = self.device
        input_ids, attention = rows["prompt_ids"], rows["prompt_mask"]
        if completion_ids is None:
            return {"input_ids": input_ids.to(device), "attention_mask": attention.to(device)}
        input_ids = torch.cat([input_ids, completion_ids], dim=1).to(device)
        attention = torch.cat([attention, completion_mask.to(attention.dtype)], dim=1).to(device)
        return {"input_ids": input_ids, "attention_mask": attention,
                "position_ids": (attention.cumsum(-1) - 1).clamp(min=0)}

    # ----- rollout -------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int],
                greedy: bool = False) -> Rollout:
        cfg = self.cfg
        parts = self._prompt_parts(prompts)
        encoded = self._encode_parts(parts)
        rows = self._expand(encoded, group_size)
        if cfg.rollout_engine == "vllm":
            completion_ids, rollout_logp = self._vllm_generate(parts, encoded, group_size, seeds, greedy)
            return self._rollout_record(prompts, group_size, rows, completion_ids, rollout_logp)
        gen_cfg = GenerationConfig(max_new_tokens=cfg.max_new_tokens, min_new_tokens=cfg.min_new_tokens,
                                   do_sample=False,
                                   pad_token_id=self.tokenizer.pad_token_id,
                                   eos_token_id=self.model.generation_config.eos_token_id
                                   or self.tokenizer.eos_token_id,
                                   stop_strings=cfg.stop_strings or None,
                                   suppress_tokens=self.suppressed_tokens() or None)
        processors = LogitsProcessorList()
        sampler = None
        if not greedy:
            sampler = GroupSeededSampler(seeds, group_size, cfg.temperature, cfg.top_k, cfg.top_p)
            processors.append(sampler)
        was_training = self.model.training
        self.model.eval()
        inputs = None
        if cfg.shared_prefill and group_size > 1:
            inputs = self._shared_prefill(encoded, rows, group_size)
        sequences = self.model.generate(
            **(inputs or self._model_inputs(rows)), generation_config=gen_cfg, logits_processor=processors,
            tokenizer=self.tokenizer if cfg.stop_strings else None, synced_gpus=self.synced_rollouts)
        self.model.train(was_training)
        completion_ids = sequences[:, rows["prompt_ids"].shape[1]:]
        rollout_logp = sampler.sampled_logp(completion_ids.shape[1]) if sampler is not None else None
        return self._rollout_record(prompts, group_size, rows, completion_ids, rollout_logp)

    def _rollout_record(self, prompts: Sequence[Any], group_size: int, rows: dict[str, Any], completion_ids: Tensor,
                        rollout_logp: Tensor | None) -> Rollout:
        """The Rollout of sampled `completion_ids` [N, T] (and their sampler log-probs [N, T] or None)."""
        cfg = self.cfg
        unit_mask, truncated = self._completion_mask(completion_ids)
        completion_ids = completion_ids.masked_fill(unit_mask == 0, self.tokenizer.pad_token_id)
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        if cfg.mask_truncated:
            unit_mask = unit_mask * (~truncated)[:, None]
        return Rollout(
            group_id=torch.arange(len(prompts)).repeat_interleave(group_size),
            prompts=[self.prompt_of(p) for p in prompts for _ in range(group_size)],
            completions=texts,
            unit_mask=unit_mask.float().cpu(),
            truncated=truncated.cpu(),
            columns={"completion_ids": [ids[:int(n)].tolist() for ids, n in zip(completion_ids, unit_mask.sum(1))]},
            extras={**rows, "completion_ids": completion_ids.cpu()},
            rollout_logp=None if rollout_logp is None else (rollout_logp.float().cpu() * unit_mask.cpu()),
        )

    def _vllm_generate(self, parts: list, encoded: dict[str, Any], group_size: int,
                       seeds: Sequence[int], greedy: bool) -> tuple[Tensor, Tensor | None]:
        """Completion ids and sampler log-probs from the colocated vLLM engine (vllm_engine.py)
        for prompts given by their `_prompt_parts` and their encoding."""
        cfg = self.cfg
        if self._vllm is None:
            self._vllm = self._vllm_engine()
        prompt_ids = [ids[mask.bool()].tolist() for ids, mask in zip(encoded["prompt_ids"], encoded["prompt_mask"])]
        requests = self._vllm_prompts(parts, prompt_ids)
        return self._vllm.generate(
            self.model, requests, group_size, seeds, greedy=greedy, temperature=cfg.temperature, top_k=cfg.top_k,
            top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, min_new_tokens=cfg.min_new_tokens,
            stop_token_ids=eos_token_ids(self.model, self.tokenizer), pad_token_id=self.tokenizer.pad_token_id,
            stop_strings=cfg.stop_strings, banned_token_ids=self.suppressed_tokens(),
            expected_prompt_ids=None if requests is prompt_ids else prompt_ids)

    def _vllm_engine(self) -> VLLMEngine:
        """The engine, built on the first vLLM rollout."""
        cfg = self.cfg
        return VLLMEngine(cfg.vllm, self.model, DTYPES[cfg.dtype], self.device,
                          tokenizer=self.tokenizer if cfg.stop_strings else None)

    def _vllm_prompts(self, parts: list, prompt_ids: list[list[int]]) -> list:
        """What the engine is given for each prompt (its `_prompt_parts`, its token ids): the token
        ids (a text model's)."""
        return prompt_ids

    def _shared_prefill(self, encoded: dict[str, Any], rows: dict[str, Any],
                        group_size: int) -> dict[str, Any] | None:
        """`generate`'s inputs for the expanded `rows`, with a KV cache of every prompt but its last
        token computed ONCE per prompt (its media encoded once) and repeated for the `group_size`
        rows of its group; `generate` then runs each row's last prompt token on that cache and
        samples. Position ids (multimodal rotary ones included) come from the model's own
        `generate` rule on the whole prompt, so the rows see the positions of a plain prefill.
        None, logged once, where the model cannot continue from a repeated cache."""
        # the transformers model answers what it takes (a PEFT wrapper's forward takes **kwargs)
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        ids = encoded["prompt_ids"]
        media_slots = torch.tensor(self.suppressed_tokens(), dtype=ids.dtype)
        reason = None
        if ids.shape[1] < 2:
            reason = "a one-token prompt has nothing to prefill"
        elif torch.isin(ids[:, -1], media_slots).any():
            reason = "a prompt ends with a media placeholder"
        elif not hasattr(base, "_prepare_position_ids_for_generation"):
            reason = f"{type(base).__name__} has no generate-time position ids"
        if reason is None:
            forward_args = inspect.signature(base.forward).parameters
            positions = None
            if "position_ids" in forward_args:  # as `generate` does, for the models that take them
                whole = self._model_inputs(encoded)
                positions = base._prepare_position_ids_for_generation(whole["input_ids"], whole)
            head = self._model_inputs({k: v[:, :-1] if k.startswith("prompt_") else v for k, v in encoded.items()})
            if positions is not None:
                head["position_ids"] = positions[..., :-1]
            keep = {"logits_to_keep": 1} if "logits_to_keep" in forward_args else {}
            cache = self.model(**head, use_cache=True, **keep).past_key_values
            if not isinstance(cache, Cache) or cache.get_seq_length() != ids.shape[1] - 1:
                reason = f"{type(base).__name__} returned no KV cache of the prompt's length"
            elif not all(isinstance(layer, DynamicLayer) and not isinstance(layer, LinearAttentionCacheLayerMixin)
                         for layer in cache.layers):  # recurrent states are not repeated by the cache
                reason = f"{type(base).__name__}'s cache is not made of key/value layers"
        if reason is not None:
            _log_once(f"shared prefill off, every group member is prefilled: {reason}")
            return None
        cache.batch_repeat_interleave(group_size)
        inputs = self._model_inputs({k: v for k, v in rows.items() if k.startswith("prompt_")})
        if positions is not None:
            inputs["position_ids"] = positions.repeat_interleave(group_size, dim=positions.dim() - 2)
        inputs["past_key_values"] = cache
        return inputs

    def _completion_mask(self, completion_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Units up to and including the first eos, or up to the token that completes a stop
        string; truncated = neither happened within max_new_tokens. (A sampled pad token is an
        ordinary token: only eos and stop strings end a completion.)"""
        end = first_eos_ends(completion_ids, eos_token_ids(self.model, self.tokenizer))
        if self.cfg.stop_strings:
            end = torch.minimum(end, self._stop_string_ends(completion_ids, end))
        return units_before(end, completion_ids.shape[1])

    def _stop_string_ends(self, completion_ids: Tensor, end: Tensor) -> Tensor:
        """Per row, 1 + the first token index whose prefix text contains a stop string (binary
        search over prefix lengths: containment is monotone), else length + 1."""
        length = completion_ids.shape[1]
        out = torch.full_like(end, length + 1)
        stops = self.cfg.stop_strings

        def hit(row: Tensor, k: int) -> bool:
            text = self.tokenizer.decode(row[:k], skip_special_tokens=True)
            return any(s in text for s in stops)

        for i, row in enumerate(completion_ids.tolist()):
            limit = min(int(end[i]), length)
            if not hit(row, limit):
                continue
            lo, hi = 1, limit
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if hit(row, mid) else (mid + 1, hi)
            out[i] = lo
        return out

    def concat(self, parts: Sequence[Rollout]) -> Rollout:
        """Pad prompt ids on the left and completion ids on the right to common widths."""
        return concat_padded(parts, self.tokenizer.pad_token_id)

    # ----- log-probs -----------------------------------------------------------------------
    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        completion_ids = batch.extras["completion_ids"]
        width = completion_ids.shape[1]
        used = used_width(batch.unit_mask)  # drop all-padding tail columns
        mask = batch.unit_mask[:, :used]
        groups = self._shared_prefix_groups(batch, mask)
        if groups is None:
            logp, ent = self._token_logprobs(model, batch.extras, completion_ids[:, :used], mask,
                                             self.cfg.temperature, with_entropy)
        else:
            logp, ent = self._shared_token_logprobs(model, batch.extras, groups, completion_ids[:, :used],
                                                    mask, self.cfg.temperature, with_entropy)
        return full_width(logp * mask.to(logp.device), ent, width, units)

    def _token_logprobs(self, model: nn.Module, rows: dict[str, Any], completion_ids: Tensor,
                        completion_mask: Tensor, temperature: float, with_entropy: bool,
                        as_sampled: bool = True) -> tuple[Tensor, Tensor | None]:
        """Log-probs of `completion_ids` after the prompts: as the rollout sampler scores them
        (`as_sampled`), or under the model's whole softmax (the supervised warm start's NLL)."""
        c = completion_ids.shape[1]
        out = model(**self._model_inputs(rows, completion_ids, completion_mask), logits_to_keep=c + 1,
                    use_cache=False)
        device = out.logits.device
        logits = out.logits[:, -(c + 1):-1]  # some models return every position
        logits = self._sampling_logits(logits, temperature) if as_sampled else logits / temperature
        return selective_log_softmax(logits, completion_ids.to(device), self.cfg.logprob_chunk_rows,
                                     with_entropy)

    def _sampling_logits(self, logits: Tensor, temperature: float) -> Tensor:
        """The logits as the rollout sampler scores them at every position: divided by the
        temperature, the never-sampled tokens (`suppressed_tokens`) banned. The sampler's top-k /
        top-p truncation and min_new_tokens' early-EOS ban are not applied (docs/methods.md,
        'Rollout log-probs'). A ban is the dtype's lowest value, not -inf, so the entropy stays finite."""
        if temperature != 1.0:
            logits = logits / temperature
        banned = self.suppressed_tokens()
        if banned:
            logits = logits.index_fill(-1, torch.tensor(banned, device=logits.device), torch.finfo(logits.dtype).min)
        return logits

    # ----- shared-prefix log-probs (prefix_sharing.py) -----------------------------------
    def _shared_prefix_groups(self, batch: Rollout, completion_mask: Tensor) -> list[list[int]] | None:
        """The micro-batch's rows grouped by prompt when its log-probs run with the prompt shared
        (`policy.prefix_sharing`), else None. The choice depends on the micro-batch alone, so the
        old, reference and training passes over it take the same path."""
        mode = self.cfg.prefix_sharing
        if mode == "off":
            return None
        reason = unsupported_reason(self.model.config)
        if reason is not None:
            _log_once(f"policy.prefix_sharing={mode}: {reason}; log-probs use the plain forward")
            return None
        groups = prompt_groups(batch.group_id, batch.extras["prompt_ids"], batch.auxiliary)
        if mode == "auto" and not worth_sharing(batch.extras["prompt_mask"], completion_lengths(completion_mask),
                                                groups):
            return None
        return groups

    def _shared_token_logprobs(self, model: nn.Module, rows: dict[str, Any], groups: list[list[int]],
                               completion_ids: Tensor, completion_mask: Tensor, temperature: float,
                               with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """`_token_logprobs` with each group's prompt run once: one sequence per group holding the
        prompt and the group's completions, under the shared-prefix mask."""
        n = completion_ids.shape[0]
        leaders = torch.tensor([g[0] for g in groups])  # one row stands for its group's prompt
        prefix = {k: take_rows(v, leaders, n) for k, v in rows.items() if k != "completion_ids"}
        start = int(prefix["prompt_mask"].any(0).int().argmax())  # drop columns that are padding in every prompt
        prefix = {k: v[:, start:] if k.startswith("prompt_") and isinstance(v, Tensor) else v
                  for k, v in prefix.items()}
        layout = SharedLayout.build(prefix["prompt_ids"], prefix["prompt_mask"], completion_ids,
                                    completion_lengths(completion_mask), groups, self.tokenizer.pad_token_id)
        inputs = self._shared_model_inputs(prefix, layout)
        inputs["attention_mask"] = layout.attention_mask(self.model.config.get_text_config(decoder=True),
                                                         next(self.model.parameters()).dtype, self.device)
        out = model(**inputs, logits_to_keep=layout.region + 1, use_cache=False)
        device = out.logits.device
        kept = self._sampling_logits(out.logits[:, -(layout.region + 1):], temperature)  # positions W - 1 .. W + R - 1
        chunk = self.cfg.logprob_chunk_rows
        # unit 0 of every row from its prefix's last logit; units t >= 1 from the region's logits
        first, first_ent = selective_log_softmax(kept[:, 0][layout.row_group.to(device)],
                                                 completion_ids[:, 0].to(device), chunk, with_entropy)
        targets = layout.next_ids().to(device)  # over all kept logits (no strided copy); column 0 unused
        targets = torch.cat([targets[:, :1], targets], dim=1)
        region, region_ent = selective_log_softmax(kept, targets, chunk, with_entropy)
        index = layout.gather.to(device)
        is_first = torch.arange(index.shape[1], device=device)[None, :] == 0
        logp = torch.where(is_first, first[:, None], region[:, 1:].reshape(-1)[index])
        ent = (torch.where(is_first, first_ent[:, None], region_ent[:, 1:].reshape(-1)[index])
               if with_entropy else None)
        return logp, ent

    def _shared_model_inputs(self, prefix: dict[str, Any], layout: SharedLayout) -> dict[str, Tensor]:
        """Keyword inputs of the shared forward but the mask: ids and position ids."""
        return {"input_ids": layout.input_ids.to(self.device),
                "position_ids": layout.positions(self._prefix_positions(prefix)).to(self.device)}

    def _prefix_positions(self, prefix: dict[str, Any]) -> Tensor:
        """Positions [S, W + 1] of each prompt and of the token after it, as `_model_inputs` gives."""
        mask = prefix["prompt_mask"]
        return (torch.cat([mask, torch.ones_like(mask[:, :1])], 1).cumsum(-1) - 1).clamp(min=0)

    def supervised_loss(self, model: nn.Module, rows: Sequence[dict], target_column: str) -> Tensor:
        """Mean token NLL of `target_column` (+ eos) after the prompt, at temperature 1, over the
        whole vocabulary (standard supervised fine-tuning; no sampler bans)."""
        prompts = self._encode_prompts(rows)
        targets = [self.tokenizer(str(r[target_column]), add_special_tokens=False)["input_ids"]
                   + [self.tokenizer.eos_token_id] for r in rows]
        width = max(len(t) for t in targets)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width)
        for i, t in enumerate(targets):
            ids[i, :len(t)] = torch.tensor(t)
            mask[i, :len(t)] = 1
        logp, _ = self._token_logprobs(model, prompts, ids, mask, 1.0, False, as_sampled=False)
        mask = mask.to(logp.device)
        return -(logp * mask).sum() / mask.sum()

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
