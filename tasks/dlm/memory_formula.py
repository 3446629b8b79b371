"""The memory formula of a masked diffusion LM (the dlm adapter's `memory_model`, family `masked`;
docs/memory-plan.md): a bidirectional decoder whose units' log-probs are an estimator's weighted sum
over views of the canvas with tokens masked (`estimators.py`). From the transformers configuration:

- a training pass runs the decoder once per view and keeps every view's graph until the backward
  (the estimate sums the views): each view's activations, the causal LM's per token and layer
  (tasks/lm/memory_formula.py), over the whole canvas (prompt and `gen_length`); the views are
  counted by running the recipe's estimator on a full-length row whose decoding steps follow the
  recipe's schedule (`views_per_pass`);
- with `policy.logprobs_from: logits` (the family's default), each view also keeps its logits of the
  completion's positions ([rows, gen_length, vocabulary] in the weights' dtype, the model's
  `logits_to_keep`), and the backward of the first one adds their gradient (the same size), an fp32
  block of at most `SOFTMAX_BLOCK_ROWS` of them and the two pieces of the softmax's element-wise
  work; with `hidden_states`, the causal LM's chunked head (one chunk of fp32 logits, the pieces,
  the output layer's gradient), and the first step's `policy.logprob_check` runs the plain path one
  row and one view at a time beside the pass's graph;
- a rollout decodes block after block without a cache: each step's forward of the whole canvas
  (its MLP's gate, up and product, [rows, canvas, intermediate] each, beside four [rows, canvas,
  hidden] buffers: the residual stream, the norm's output, the attention's output and its
  projection; the attention's scores are never materialised (PyTorch's SDPA); twice the rows with
  `cfg_scale`), or, where larger, the sampler's work on the step's fp32 logits of the block's
  positions, one group at a time (generation.py): `SAMPLER_BYTES` per logit of the group (float64
  Gumbel noise, softmax and log-softmax for the confidence and the recorded log-probs; read off the
  allocation probe, docs/benchmarks.md); the logits of every row beside either.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import transformers

from mmrl.errors import UserError

from ..lm.memory_formula import DecoderMemory
from ..model_loading import DTYPES, load_tiny, pretrained, weightless
from .estimators import LOGP_ESTIMATORS, EstimatorInputs, estimator_args
from .generation import transfer_counts

SOFTMAX_BLOCK_ROWS = 1024  # rows of the logits path's fp32 block (selective_log_softmax's default chunk)
SAMPLER_BYTES = 32  # bytes per logit of one group's float64 sampler work at a decoding step (the probe's)


class MaskedDLMMemory(DecoderMemory):
    """A masked diffusion LM's memory: `views` decoder passes per training pass."""

    family = "masked diffusion LM (bidirectional decoder)"

    def __init__(self, module: torch.nn.Module, cfg: Any, prompt_length: int, views: int):
        super().__init__(module, cfg.gradient_checkpointing, prompt_length, cfg.gen_length, cfg.logprob_chunk_tokens,
                         SOFTMAX_BLOCK_ROWS, cfg.logprob_check and cfg.logprobs_from == "hidden_states")
        self.views = views
        self.from_hidden = cfg.logprobs_from == "hidden_states"
        self.block = cfg.block_length
        self.guided = cfg.cfg_scale > 0

    def activation_bytes(self, rows: int, checkpointing: bool) -> int:
        return self.views * super().activation_bytes(rows, checkpointing)

    def update_bytes(self, rows: int, prompts: int, trains_head: bool) -> dict[str, int]:
        if self.from_hidden:
            return super().update_bytes(rows, prompts, trains_head)
        logits = rows * self.completion * self.vocab
        block = min(SOFTMAX_BLOCK_ROWS, rows * self.completion)
        return {"activations": self.activation_bytes(rows, self.checkpointing),
                "logits (every view)": self.views * logits * self.bytes, "logits gradient": logits * self.bytes,
                "fp32 block": block * self.vocab * 4, "softmax pieces": 2 * self.piece_rows(block) * self.vocab * 4}

    def first_step_bytes(self, rows: int, prompts: int) -> dict[str, int]:
        if not self.check:
            return {}
        block = min(SOFTMAX_BLOCK_ROWS, self.completion)
        return {"activations": self.activation_bytes(rows, self.checkpointing),
                "logits (one row, one view)": self.completion * self.vocab * self.bytes,
                "fp32 block": block * self.vocab * 4, "softmax pieces": 2 * self.piece_rows(block) * self.vocab * 4}

    def rollout_bytes(self, rows: int, group_size: int) -> dict[str, int]:
        forward_rows = 2 * rows if self.guided else rows
        forward = forward_rows * self.length * (3 * self.intermediate + 4 * self.hidden) * self.bytes
        logits = rows * self.block * self.vocab * 4
        sampler = SAMPLER_BYTES * min(group_size, rows) * self.block * self.vocab
        if forward > sampler:
            return {"decoding step: forward": forward, "decoding step: logits": logits}
        return {"decoding step: logits": logits, "decoding step: one group's sampler": sampler}


def views_per_pass(cfg: Any, prompt_length: int) -> int:
    """The decoder passes the recipe's estimator runs per training pass, at most, on a full-length row
    (`gen_length` units) whose tokens were committed as the recipe's decoding schedule commits them."""
    blocks = cfg.gen_length // cfg.block_length
    order = [step for b in range(blocks)
             for s, count in enumerate(transfer_counts(cfg.block_length, cfg.steps // blocks, cfg.schedule))
             for step in [b * (cfg.steps // blocks) + s] * count]
    args = estimator_args(cfg)
    inputs = EstimatorInputs([torch.Generator().manual_seed(0)], torch.ones(1, max(prompt_length, 1), dtype=torch.long),
                             cfg.gen_length, torch.tensor([cfg.gen_length]), args, torch.tensor([order]),
                             torch.ones(1, cfg.gen_length))
    try:
        views = LOGP_ESTIMATORS.get(cfg.estimator)(inputs)
    except ValueError as err:  # a setting the estimator refuses, named as the run would name it
        raise UserError(f"mmrl plan: {err}") from None
    return len(views)  # a view that draws no masked unit is skipped by the pass: the plan counts every one


def masked_dlm_memory(cfg: Any, prompt_length: int) -> MaskedDLMMemory:
    """The formula over the weightless build of `cfg`'s model (family `masked`); what it does not
    model is refused by name."""
    with weightless():
        if cfg.model.startswith("tiny:"):
            module = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)[0]
        else:
            module = pretrained(getattr(transformers, cfg.auto_class), cfg.model, dtype=DTYPES[cfg.dtype],
                                trust_remote_code=cfg.trust_remote_code)
    if "logits_to_keep" not in inspect.signature(module.forward).parameters:
        raise UserError(f"mmrl plan: {cfg.model}'s forward takes no logits_to_keep (its logits of the whole canvas "
                        "are not modelled); its memory is not planned")
    return MaskedDLMMemory(module, cfg, prompt_length, views_per_pass(cfg, prompt_length))
