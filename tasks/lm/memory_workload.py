"""The memory plan's workload of the token adapters (`causal_lm`, `vlm`, `audio_lm`): their own code
on a model built from its configuration on the meta device (`Policy.memory_workload`,
mmrl/core/memory.py).

The rollout is what `TokenRollouts.rollout` does that takes memory, with the HF engine: the
prompts encoded (media decoded and processed as for training), the prefill (shared across the
group when `policy.shared_prefill` is on), then one decoding step as transformers' `generate` takes
it (the model on the newest token over the cache, the step's logits copied to fp32, the group
sampler on them). The KV cache then grows by one position per token to the whole completion:
`rollout_growth` adds those positions (bytes per cached position measured on the prefill's cache)
and the copy of one layer's cache that each append makes. The record is the adapter's own, of
completions of `max_new_tokens` random non-EOS tokens: every update pass is traced at full length.

With `policy.rollout_engine: vllm` the engine holds its own copy of the weights and a cache sized by
`policy.vllm.gpu_memory_utilization` of the device: the workload reports that share
(`engine_share`), and traces no HF rollout.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrl.core.memory import MemoryWorkload, StepShape
from mmrl.core.rollout import Rollout

from ..model_loading import weightless
from .seeded_sampler import GroupSeededSampler


def cache_bytes(cache: Any) -> tuple[int, int, int]:
    """(bytes, cached positions, layers) of a transformers key/value cache."""
    total, positions = 0, 0
    for layer in cache.layers:
        for tensor in (layer.keys, layer.values):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
        positions = max(positions, cache.get_seq_length())
    return total, positions, len(cache.layers)


class TokenWorkload:
    """A token policy built without weights, and its step's work (module docstring)."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.per_position = 0.0  # cache bytes per row and position, from the last traced prefill
        self.layers = 1

    def rollout(self, shape: StepShape) -> Rollout:
        """One generation call of `shape`: the prefill and one decoding step; its record."""
        policy, cfg = self.policy, self.policy.cfg
        group = shape.group_size
        encoded = policy._encode_parts(policy._prompt_parts(shape.prompts))
        rows = policy._expand(encoded, group)
        if cfg.rollout_engine == "hf":
            with torch.inference_mode():
                self._prefill_and_step(encoded, rows, group)
        width = cfg.max_new_tokens
        eos = set(policy.tokenizer.all_special_ids)
        token = next(t for t in range(len(policy.tokenizer)) if t not in eos)
        completion_ids = torch.full((shape.rows, width), token, dtype=torch.long)
        return policy._rollout_record(shape.prompts, group, rows, completion_ids, torch.zeros(shape.rows, width))

    def _prefill_and_step(self, encoded: dict, rows: dict, group: int) -> None:
        policy, cfg = self.policy, self.policy.cfg
        model = policy.model
        inputs = policy._shared_prefill(encoded, rows, group) if cfg.shared_prefill and group > 1 else None
        if inputs is None:
            inputs = policy._model_inputs(rows)
            cache = model(**inputs, use_cache=True, logits_to_keep=1).past_key_values
        else:
            cache = inputs.pop(next(k for k, v in inputs.items() if hasattr(v, "layers")))
        total, positions, self.layers = cache_bytes(cache)
        n = len(rows["prompt_ids"])
        self.per_position = total / max(n * positions, 1)
        ids = rows["prompt_ids"]
        mask = torch.cat([rows["prompt_mask"], torch.ones(n, 1, dtype=rows["prompt_mask"].dtype)], 1)
        step = model(input_ids=ids[:, -1:].to(policy.device), attention_mask=mask.to(policy.device),
                     position_ids=(mask.sum(1, keepdim=True) - 1).to(policy.device), past_key_values=cache,
                     use_cache=True, logits_to_keep=1)
        scores = step.logits[:, -1, :].to(copy=True, dtype=torch.float32)  # as `generate` takes a step's logits
        sampler = GroupSeededSampler(list(range(n // group)), group, cfg.temperature, cfg.top_k, cfg.top_p,
                                     eos_ids=[policy.tokenizer.eos_token_id], min_new_tokens=cfg.min_new_tokens)
        sampler(ids, scores)

    def rollout_growth(self, shape: StepShape) -> int:
        """The cache's positions from the prompt to the whole completion, and one layer's copy as it grows."""
        if self.policy.cfg.rollout_engine != "hf":
            return 0
        grown = self.per_position * shape.rows * self.policy.cfg.max_new_tokens
        return int(grown + grown / max(self.layers, 1))

    def checkpointing(self, on: bool) -> None:
        model = self.policy.model
        if on:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        else:
            model.gradient_checkpointing_disable()


def token_workload(policy_class: type, cfg: Any) -> MemoryWorkload:
    """`policy_class(cfg)` built without weights, and its workload."""
    with weightless():
        policy = policy_class(cfg)
    work = TokenWorkload(policy)
    notes = ["sampling stops at max_new_tokens for every row (EOS never ends a completion early)"]
    share = 0.0
    if cfg.rollout_engine == "vllm":
        share = cfg.vllm.gpu_memory_utilization
        notes.append(f"vLLM reserves policy.vllm.gpu_memory_utilization={share} of the device for its weights and "
                     "cache; its own activations inside that share are not traced")
    if getattr(cfg, "episode", None) is not None and cfg.episode.tools:
        notes.append("episodes: tool turns are not traced; a row is planned at policy.max_new_tokens")
    return MemoryWorkload(policy=policy, held={"model": policy.model}, rollout=work.rollout,
                          rollout_growth=work.rollout_growth, checkpointing=work.checkpointing,
                          engine_share=share, notes=notes)
