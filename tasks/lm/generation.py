"""The rollouts of the token adapters (`causal_lm` and the multimodal ones): completions sampled
by HF ``generate`` with the KV cache, or by a colocated vLLM engine (`vllm_engine.py`).

Sampling is done by `GroupSeededSampler` (`seeded_sampler.py`), so a group's completions depend
on its prompt and seed only, not on which other groups share the batch or the process; the
sampler records the log-probs it drew with (`Rollout.rollout_logp`). With `shared_prefill` (the
default), each prompt is prefilled once, its media encoded once, and its KV cache repeated for the
G rows of its group before sampling, instead of prefilling G identical copies; the samples are the
same either way.
"""

from __future__ import annotations

import inspect
import logging
from functools import lru_cache
from typing import Any, Sequence

import torch
from torch import Tensor
from transformers import GenerationConfig, GenerationMixin, LogitsProcessorList
from transformers.cache_utils import Cache, DynamicLayer, LinearAttentionCacheLayerMixin

from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout

from ..model_loading import DTYPES
from .chat_prompts import check_prompt_lengths
from .rollout_batches import concat_padded, eos_token_ids, first_eos_ends, units_before
from .seeded_sampler import GroupSeededSampler
from .vllm_engine import VLLMEngine

logger = logging.getLogger(__name__)
# the KV cache's name in model outputs and generate's arguments: `cache` from transformers 5.2x on
# (`past_key_values` still works there, with a deprecation warning), `past_key_values` before
KV_CACHE = ("cache" if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
            else "past_key_values")


@lru_cache(maxsize=None)
def warn_once(log: logging.Logger, message: str) -> None:
    """Log `message` as a warning on `log` the first time this process sees it there."""
    log.warning(message)


class TokenRollouts(Policy):
    """The rollout half of a token policy (`CausalLMPolicy` builds on it): `rollout` with either
    engine (`policy.rollout_engine`), the completion mask (eos, stop strings), `concat`. It reads
    the subclass's `cfg` (a `CausalLMConfig`), `model`, `tokenizer`, `_vllm` (the engine or None)
    and its prompt encoding: `_prompt_parts`, `_encode_parts`, `_model_inputs`, `suppressed_tokens`;
    with `policy.episode.tools`, `_episodes` (an `EpisodeRunner`) runs the rollouts instead."""

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

    @torch.no_grad()
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int],
                greedy: bool = False) -> Rollout:
        cfg = self.cfg
        if self._episodes is not None:  # multi-turn, tool-using rollouts (episodes.py)
            return self._episodes.rollout(prompts, group_size, seeds, greedy)
        parts = self._prompt_parts(prompts)
        encoded = self._encode_parts(parts)
        self._check_prompt_lengths(encoded["prompt_mask"], prompts)
        rows = self._expand(encoded, group_size)
        if cfg.rollout_engine == "vllm":
            completion_ids, rollout_logp = self._vllm_generate(parts, encoded, group_size, seeds, greedy)
            return self._rollout_record(prompts, group_size, rows, completion_ids, rollout_logp)
        eos = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        gen_cfg = GenerationConfig(max_new_tokens=cfg.max_new_tokens,
                                   min_new_tokens=cfg.min_new_tokens if greedy else None,  # else the sampler's ban
                                   do_sample=False,
                                   pad_token_id=self.tokenizer.pad_token_id, eos_token_id=eos,
                                   stop_strings=cfg.stop_strings or None,
                                   suppress_tokens=self.suppressed_tokens() or None)
        processors = LogitsProcessorList()
        sampler = None
        if not greedy:
            sampler = GroupSeededSampler(seeds, group_size, cfg.temperature, cfg.top_k, cfg.top_p,
                                         eos_ids=[eos] if isinstance(eos, int) else list(eos or []),
                                         min_new_tokens=cfg.min_new_tokens or 0)
            processors.append(sampler)
        was_training = self.model.training
        self.model.eval()
        # no autograd bookkeeping at all (what comes out is copied below), except where every forward
        # gathers sharded parameters (`parallel.lockstep`): parameters materialised in
        # inference mode could not be trained afterwards
        with torch.inference_mode(not self.parallel.lockstep):
            inputs = None
            if cfg.shared_prefill and group_size > 1:
                inputs = self._shared_prefill(encoded, rows, group_size)
            sequences = self.model.generate(
                **(inputs or self._model_inputs(rows)), generation_config=gen_cfg, logits_processor=processors,
                tokenizer=self.tokenizer if cfg.stop_strings else None, synced_gpus=self.parallel.lockstep)
        self.model.train(was_training)
        completion_ids = sequences[:, rows["prompt_ids"].shape[1]:].clone()  # an ordinary tensor, fit for autograd
        rollout_logp = sampler.sampled_logp(completion_ids.shape[1]) if sampler is not None else None
        return self._rollout_record(prompts, group_size, rows, completion_ids, rollout_logp)

    def pop_metrics(self) -> dict[str, float]:
        """An episode policy's counts of its last rollouts: episodes, turns, tool calls per tool,
        tool errors, truncated episodes."""
        return self._episodes.pop_metrics() if self._episodes is not None else {}

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
        """Completion ids and sampler log-probs from the colocated vLLM engine (`vllm_engine.py`)
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
                          tokenizer=self.tokenizer if cfg.stop_strings else None, parallel=self.parallel)

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
            cache = self.model(**head, use_cache=True, **keep).get(KV_CACHE)
            if not isinstance(cache, Cache) or cache.get_seq_length() != ids.shape[1] - 1:
                reason = f"{type(base).__name__} returned no KV cache of the prompt's length"
            elif not all(isinstance(layer, DynamicLayer) and not isinstance(layer, LinearAttentionCacheLayerMixin)
                         for layer in cache.layers):  # recurrent states are not repeated by the cache
                reason = f"{type(base).__name__}'s cache is not made of key/value layers"
        if reason is not None:
            warn_once(logger, f"shared prefill off, every group member is prefilled: {reason}")
            return None
        cache.batch_repeat_interleave(group_size)
        inputs = self._model_inputs({k: v for k, v in rows.items() if k.startswith("prompt_")})
        if positions is not None:
            inputs["position_ids"] = positions.repeat_interleave(group_size, dim=positions.dim() - 2)
        inputs[KV_CACHE] = cache
        return inputs

    def _check_prompt_lengths(self, mask: Tensor, prompts: Sequence[Any]) -> None:
        """A UserError for a prompt (mask [P, L]) over policy.max_prompt_length (a text prompt is cut
        to it before), or one that leaves fewer than max_new_tokens of the model's positions."""
        cfg = self.cfg
        config = self.model.config
        positions = getattr(config, "max_position_embeddings", None) or getattr(
            getattr(config, "text_config", None), "max_position_embeddings", None)
        check_prompt_lengths(mask, prompts, [
            (cfg.max_prompt_length, "of policy.max_prompt_length"),
            (positions - cfg.max_new_tokens if positions is not None else None,
             f"the model's {positions} positions leave beside policy.max_new_tokens")], self.prompt_of)

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
