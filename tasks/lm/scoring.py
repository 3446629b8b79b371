"""The log-probs of the token adapters (`causal_lm` and the multimodal ones): fp32 log-probs of
the completion tokens, at the sampling temperature with the never-sampled tokens banned as the
sampler bans them. With `policy.logprobs_from: hidden_states` (`output_head.py`), the model runs
without computing logits and `hidden_state_logprobs` projects the completion positions' hidden
states a chunk at a time; with `logits`, `selective_log_softmax` reads the model's logits of the
completion positions. With `policy.prefix_sharing`, each group's prompt runs once
(`prefix_sharing.py`). `policy.logprob_check` compares the two paths once (`logprob_check.py`)."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout, take_rows

from .generation import warn_once
from .logprob_check import compare_paths
from .logprob_settings import check_tolerance, output_head_for
from .output_head import OutputHead
from .prefix_sharing import SharedLayout, completion_lengths, prompt_groups, unsupported_reason, worth_sharing
from .rollout_batches import full_width, used_width
from .token_logprobs import selective_log_softmax

logger = logging.getLogger(__name__)


class TokenScoring(Policy):
    """The log-prob half of a token policy (`CausalLMPolicy` builds on it): `logprobs`, plain or
    with each group's prompt shared. It reads the subclass's `cfg` (a `CausalLMConfig`), `model`,
    `tokenizer`, and its `_model_inputs` and `suppressed_tokens`."""

    _logprobs_checked = False  # policy.logprob_check ran (on this process's first micro-batch)

    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        completion_ids = batch.extras["completion_ids"]
        width = completion_ids.shape[1]
        used = used_width(batch.unit_mask)  # drop all-padding tail columns
        mask = batch.unit_mask[:, :used]
        groups = self._shared_prefix_groups(batch, mask)
        head = self._output_head(model)
        ids = completion_ids[:, :used]
        if groups is None:
            logp, ent = self._token_logprobs(model, batch.extras, ids, mask, self.cfg.temperature, with_entropy,
                                             head=head)
        else:
            logp, ent = self._shared_token_logprobs(model, batch.extras, groups, ids, mask, self.cfg.temperature,
                                                    with_entropy, head)
        if head is not None and self.cfg.logprob_check and not self._logprobs_checked:
            self._logprobs_checked = True  # the run's first micro-batch on this process
            plain = self._plain_logprobs(model, batch, ids, mask)
            compare_paths(logp.detach(), plain, mask.to(logp.device), check_tolerance(self.cfg, head), logger)
        return full_width(logp * mask.to(logp.device), ent, width, units)

    @torch.no_grad()
    def _plain_logprobs(self, model: nn.Module, batch: Rollout, ids: Tensor, mask: Tensor) -> Tensor:
        """The plainest path's log-probs [B, C] (the model's own forward and logits), one row at a
        time: the check's whole logits are one row's [C + 1, V], not the micro-batch's, beside the
        training pass's activations it runs next to."""
        rows = [self._token_logprobs(model, batch.select([i]).extras, ids[i:i + 1], mask[i:i + 1],
                                     self.cfg.temperature, False)[0] for i in range(len(batch))]
        return torch.cat(rows)

    def unit_logits(self, model: nn.Module, batch: Rollout, units: slice = slice(None)) -> Tensor:
        """fp32 logits [B, u, V] of the completion positions divided by the sampling temperature, the
        never-sampled tokens (`suppressed_tokens`) at -1e9 (on-policy distillation's jsd)."""
        completion_ids = batch.extras["completion_ids"]
        c = completion_ids.shape[1]
        inputs = self._model_inputs(batch.extras, completion_ids, batch.unit_mask)
        logits = model(**inputs, logits_to_keep=c + 1, use_cache=False).logits[:, -(c + 1):-1][:, units]
        logits = logits.float() / self.cfg.temperature
        banned = self.suppressed_tokens()
        if banned:
            logits[..., banned] = -1e9
        return logits

    def _output_head(self, model: nn.Module) -> OutputHead | None:
        """The head log-probs go through (`logprob_settings.output_head_for`; None: the logits)."""
        return output_head_for(model, self.cfg, self.parallel, logger)

    def _token_logprobs(self, model: nn.Module, rows: dict[str, Any], completion_ids: Tensor,
                        completion_mask: Tensor, temperature: float, with_entropy: bool,
                        as_sampled: bool = True, head: OutputHead | None = None) -> tuple[Tensor, Tensor | None]:
        """Log-probs of `completion_ids` after the prompts: as the rollout sampler scores them
        (`as_sampled`), or under the model's whole softmax (the supervised warm start's NLL); from
        the hidden states through `head`, or from the logits without one."""
        c = completion_ids.shape[1]
        inputs = self._model_inputs(rows, completion_ids, completion_mask)
        if head is None:
            out = model(**inputs, logits_to_keep=c + 1, use_cache=False)
            logits = out.logits[:, -(c + 1):-1]  # some models return every position
            return self._scores(logits, None, completion_ids.to(logits.device), temperature, with_entropy, as_sampled)
        with head.passing_hidden_states():
            model(**inputs, logits_to_keep=c + 1, use_cache=False)
        hidden = head.hidden[:, -(c + 1):-1]
        return self._scores(hidden, head, completion_ids.to(hidden.device), temperature, with_entropy, as_sampled)

    def _scores(self, states: Tensor, head: OutputHead | None, targets: Tensor, temperature: float,
                with_entropy: bool, as_sampled: bool = True) -> tuple[Tensor, Tensor | None]:
        """fp32 log-probs (and entropies) of `targets` [...] from logits [..., V] (no `head`) or
        hidden states [..., H] through `head`: divided by the temperature and, as the rollout
        sampler scores them (`as_sampled`), the never-sampled tokens (`suppressed_tokens`) banned.
        The sampler's top-k / top-p truncation and min_new_tokens' early-EOS ban are not applied
        (docs/methods.md, 'Rollout log-probs')."""
        banned = self.suppressed_tokens() if as_sampled else []
        banned = torch.tensor(banned, device=states.device) if banned else None
        if head is None:
            return selective_log_softmax(states, targets, self.cfg.logprob_chunk_rows, with_entropy, temperature,
                                         banned)
        return head.logprobs(states, targets, temperature, self.cfg.logprob_chunk_tokens, with_entropy, banned)

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
                               with_entropy: bool, head: OutputHead | None = None) -> tuple[Tensor, Tensor | None]:
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
        if head is None:
            kept = model(**inputs, logits_to_keep=layout.region + 1, use_cache=False).logits
        else:
            with head.passing_hidden_states():
                model(**inputs, logits_to_keep=layout.region + 1, use_cache=False)
            kept = head.hidden
        kept = kept[:, -(layout.region + 1):]  # positions W - 1 .. W + R - 1
        device = kept.device
        # unit 0 of every row from its prefix's last position, units t >= 1 from the region's
        index = layout.gather.to(device)
        is_first = torch.arange(index.shape[1], device=device)[None, :] == 0
        if head is not None:  # the hidden states of each row's units, then its log-probs
            states = kept[:, 1:].reshape(-1, kept.shape[-1])[index]
            states = torch.where(is_first[..., None], kept[:, 0][layout.row_group.to(device)][:, None], states)
            return self._scores(states, head, completion_ids.to(device), temperature, with_entropy)
        first, first_ent = self._scores(kept[:, 0][layout.row_group.to(device)], None,
                                        completion_ids[:, 0].to(device), temperature, with_entropy)
        targets = layout.next_ids().to(device)  # over all kept logits (no strided copy); column 0 unused
        targets = torch.cat([targets[:, :1], targets], dim=1)
        region, region_ent = self._scores(kept, None, targets, temperature, with_entropy)
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
