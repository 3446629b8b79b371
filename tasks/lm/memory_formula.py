"""The memory formula of a decoder-only transformer trained as a causal LM (the text adapter's
`memory_model`; docs/memory-plan.md), from its transformers configuration:

- activations a training forward keeps for its backward, per token and layer, in the weights' dtype:
  the residual stream after attention and after the MLP (2 H), the two RMS norms' normalised input
  and output (4 H), the attention's rotated queries, the keys and values repeated to every query
  head, its output and that output made contiguous for the output projection (5 x heads x head_dim),
  and the gated MLP's gate, up, activation and product (4 x intermediate); plus the final norm (2 H)
  and the boolean [rows, 1, L, L] attention mask. With activation checkpointing: each layer's input
  (H per token and layer) and one layer's activations, recomputed during the backward;
- the log-probs from hidden states, whose backward is the pass's peak: the activations, one chunk of
  fp32 logits (`policy.logprob_chunk_tokens` tokens x vocabulary x 4 bytes), two pieces of the
  softmax's element-wise work (`token_logprobs.SUB_BLOCK_ELEMENTS` logits each, at most the chunk)
  and, when the output layer trains, its [vocabulary, H] gradient; or, where larger, the end of the
  backward, where a tied input embedding's dense gradient meets the head's (2 x [vocabulary, H]);
- the first step's `policy.logprob_check` (on): the training forward's activations, alive while
  the plain path runs beside it: the model's whole logits of the completions and one more position
  (rows x (completion + 1) x vocabulary, in the weights' dtype), one sequence's block of them in fp32
  (at most `policy.logprob_chunk_rows` rows) and the softmax's two pieces;
- a rollout: the key/value cache (layers x 2 x key/value heads x head_dim x tokens x rows x bytes)
  and the step's logits with the sampler's fp32 work on them (six [rows, vocabulary] fp32 buffers,
  read off the allocation probe's rollout phase; docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import AutoModelForCausalLM

from mmrl.core.memory_model import MemoryModel
from mmrl.errors import UserError

from ..model_loading import DTYPES, load_tiny, pretrained, weightless
from .token_logprobs import SUB_BLOCK_ELEMENTS

SAMPLER_BUFFERS = 6  # [rows, vocabulary] fp32 buffers of a decoding step's logits and sampling


class DecoderMemory(MemoryModel):
    """A causal LM's memory: `module` the weightless build; `completion` tokens after a prompt of
    `prompt_length`; the log-prob settings `chunk_tokens` (policy.logprob_chunk_tokens), `chunk_rows`
    (the plain path's fp32 block, policy.logprob_chunk_rows) and `check` (policy.logprob_check)."""

    family = "decoder-only transformer"

    def __init__(self, module: nn.Module, checkpointing: bool, prompt_length: int, completion: int,
                 chunk_tokens: int, chunk_rows: int, check: bool):
        super().__init__(module, checkpointing)
        config = module.config.get_text_config()  # a multimodal model's decoder
        self.hidden = config_field(config, "hidden_size")
        self.layers = config_field(config, "num_hidden_layers")
        self.vocab = config_field(config, "vocab_size")
        self.intermediate = config_field(config, "intermediate_size")
        heads = config_field(config, "num_attention_heads")
        head_dim = getattr(config, "head_dim", None) or self.hidden // heads
        self.query_width = heads * head_dim
        self.kv_width = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
        self.completion = completion
        self.length = prompt_length + completion  # tokens per rollout: prompt and completion
        self.chunk_tokens = chunk_tokens
        self.chunk_rows = chunk_rows
        self.check = check
        self.bytes = next(module.parameters()).element_size()
        self.tied = module.get_output_embeddings().weight is module.get_input_embeddings().weight

    def layer_bytes(self) -> int:
        """One token's activations in one layer (module docstring)."""
        return (6 * self.hidden + 5 * self.query_width + 4 * self.intermediate) * self.bytes

    def activation_bytes(self, rows: int, checkpointing: bool) -> int:
        tokens = rows * self.length
        kept = self.hidden * self.bytes if checkpointing else self.layer_bytes()
        recomputed = self.layer_bytes() if checkpointing else 0
        final_norm = 2 * self.hidden * self.bytes
        return tokens * (self.layers * kept + recomputed + final_norm) + rows * self.length ** 2

    def update_bytes(self, rows: int, prompts: int, trains_head: bool) -> dict[str, int]:
        chunk_rows = min(self.chunk_tokens, rows * self.completion)
        piece_rows = self.piece_rows(chunk_rows)
        gradient = self.vocab * self.hidden * self.bytes if trains_head else 0
        head = {"activations": self.activation_bytes(rows, self.checkpointing),
                "log-prob chunk": chunk_rows * self.vocab * 4, "softmax pieces": 2 * piece_rows * self.vocab * 4,
                "output layer gradient": gradient}
        if trains_head and self.tied:
            embedding = {"input embedding and output layer gradients": 2 * gradient}
            if sum(embedding.values()) > sum(head.values()):
                return embedding
        return head

    def first_step_bytes(self, rows: int, prompts: int) -> dict[str, int]:
        if not self.check:
            return {}
        block_rows = min(self.chunk_rows, self.completion)
        return {"activations": self.activation_bytes(rows, self.checkpointing),
                "logits (one row)": (self.completion + 1) * self.vocab * self.bytes,
                "fp32 block": block_rows * self.vocab * 4, "softmax pieces": 2 * self.piece_rows(block_rows) * self.vocab * 4}

    def piece_rows(self, rows: int) -> int:
        """Rows of one piece of the softmax's element-wise work over a block of `rows` rows."""
        return min(rows, max(1, SUB_BLOCK_ELEMENTS // self.vocab))

    def rollout_bytes(self, rows: int, group_size: int) -> dict[str, int]:
        cache = self.layers * 2 * self.kv_width * self.length * rows * self.bytes
        return {"KV cache": cache, "sampler": SAMPLER_BUFFERS * rows * self.vocab * 4}


def decoder_memory(cfg: Any, prompt_length: int) -> DecoderMemory:
    """The formula over the weightless build of `cfg`'s model (a tiny one, or the configuration of a
    local path or hub id, its config.json alone); settings it does not model are refused by name."""
    planned_settings(cfg)
    with weightless():
        if cfg.model.startswith("tiny:"):
            module = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)[0]
        else:
            module = pretrained(AutoModelForCausalLM, cfg.model, dtype=DTYPES[cfg.dtype],
                                trust_remote_code=cfg.trust_remote_code)
    return DecoderMemory(module, cfg.gradient_checkpointing, prompt_length, cfg.max_new_tokens, cfg.logprob_chunk_tokens,
                         cfg.logprob_chunk_rows, cfg.logprob_check)


def planned_settings(cfg: Any) -> None:
    """Refuse, in one line naming the setting, what the decoder's formula does not model."""
    if cfg.logprobs_from != "hidden_states":
        raise UserError(f"mmrl plan: policy.logprobs_from={cfg.logprobs_from!r} is not planned (the whole logits "
                        "of a pass are not modelled); plan with logprobs_from=hidden_states")
    if cfg.rollout_engine != "hf" or cfg.episode.tools:
        what = f"rollout_engine={cfg.rollout_engine!r}" if cfg.rollout_engine != "hf" else "episode.tools"
        raise UserError(f"mmrl plan: policy.{what} is not planned (only the model's own generate is modelled)")


def config_field(config: Any, name: str) -> int:
    """`config.name`, or a one-line refusal naming the field (a configuration of other names, e.g.
    remote code's own, has no formula)."""
    value = getattr(config, name, None)
    if not isinstance(value, int):
        raise UserError(f"mmrl plan: the model's configuration ({type(config).__name__}) has no {name}; the "
                        "transformer formula reads transformers' standard fields, so this model is not planned")
    return value
