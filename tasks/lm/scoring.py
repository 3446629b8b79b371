"""The log-probs of the token adapters (`causal_lm` and the multimodal ones): fp32 log-probs of
the completion tokens, at the sampling temperature with the never-sampled tokens banned as the
sampler bans them, computed by `selective_log_softmax` on the completion positions only; with
`policy.prefix_sharing`, each group's prompt runs once (`prefix_sharing.py`)."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout, take_rows

from .generation import warn_once
from .prefix_sharing import SharedLayout, completion_lengths, prompt_groups, unsupported_reason, worth_sharing
from .rollout_batches import full_width, used_width
from .token_logprobs import selective_log_softmax

logger = logging.getLogger(__name__)


class TokenScoring(Policy):
    """The log-prob half of a token policy (`CausalLMPolicy` builds on it): `logprobs`, plain or
    with each group's prompt shared. It reads the subclass's `cfg` (a `CausalLMConfig`), `model`,
    `tokenizer`, and its `_model_inputs` and `suppressed_tokens`."""

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
        if mode == "off" or "completion_context_mask" in batch.extras:  # an episode: tool turns inside
            return None
        reason = unsupported_reason(self.model.config)
        if reason is not None:
            warn_once(logger, f"policy.prefix_sharing={mode}: {reason}; log-probs use the plain forward")
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
