"""The log-probs of masked diffusion LMs (`DLMPolicy` builds on `MaskedScoring`): each unit's
log-prob is its estimator's weighted sum over views of the canvas with tokens masked
(`estimators.py`), read from the model's logits at the completion positions, or, with
`policy.logprobs_from: hidden_states`, from the hidden states of each view's scored (masked)
positions only, through the output head a chunk of tokens at a time (`tasks/lm/hidden_logprobs.py`);
`policy.logprob_check` compares the two once, on the run's first micro-batch. SPG's lower and upper
bounds come from the same views (`logprob_bounds`), AGRPO's Monte Carlo weights of the units a pass
samples from `unit_weights`."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout, take_rows

from ..lm.logprob_check import compare_paths
from ..lm.logprob_settings import check_tolerance, output_head_for
from ..lm.output_head import OutputHead
from ..lm.rollout_batches import full_width, used_width
from ..lm.token_logprobs import selective_log_softmax
from .bound_estimators import sandwich_bounds
from .estimators import EstimatorInputs, View, estimator_args, view_seed
from .trajectory_estimators import agrpo_unit_weights

logger = logging.getLogger(__name__)


class MaskedScoring(Policy):
    """The log-prob half of `DLMPolicy`: it reads the subclass's `cfg` (a `DLMConfig`), `estimate`
    (the estimator), `mask_id` and `_accepts` (the forward's keyword arguments)."""

    _logprobs_checked = False  # policy.logprob_check ran (on this process's first micro-batch)

    def logits(self, model: nn.Module, ids: Tensor, attention: Tensor, positions: Tensor) -> Tensor:
        """Logits [B, K, V] predicting the tokens at `positions` [K] of the canvas `ids` [B, L]."""
        device = next(model.parameters()).device
        ids, attention, positions = ids.to(device), attention.to(device), positions.to(device)
        wanted = positions - 1 if self.cfg.logits_shift else positions
        kwargs: dict[str, Any] = {"input_ids": ids}
        if self.cfg.attention_mask == "2d" and "attention_mask" in self._accepts:
            kwargs["attention_mask"] = attention
        elif self.cfg.attention_mask == "4d" and "attention_mask" in self._accepts:
            kwargs["attention_mask"] = (attention[:, None, :, None] * attention[:, None, None, :]).bool()
        if "position_ids" in self._accepts:
            kwargs["position_ids"] = (attention.cumsum(-1) - 1).clamp(min=0)
        if "use_cache" in self._accepts:
            kwargs["use_cache"] = False
        if "logits_to_keep" in self._accepts:
            return model(**kwargs, logits_to_keep=wanted).logits
        return model(**kwargs).logits[:, wanted]

    def pass_view(self, batch: Rollout, pass_index: int) -> Rollout:
        """The batch with the masks of update pass `pass_index` (d1: a fresh mask per pass)."""
        return replace(batch, extras={**batch.extras, "mask_pass": pass_index})

    def estimator_inputs(self, batch: Rollout) -> EstimatorInputs:
        """What the estimator draws the batch's views from: each row's generator (its mask seed and
        the update pass), its units and the rollout's decoding record."""
        ex, cfg = batch.extras, self.cfg
        generators = [torch.Generator().manual_seed(view_seed(int(s), int(ex["mask_pass"]))) for s in ex["mask_seed"]]
        args = estimator_args(cfg)
        return EstimatorInputs(generators, ex["prompt_mask"], ex["completion_ids"].shape[1],
                               batch.unit_mask.sum(1).long(), args, ex.get("completion_step"),
                               ex.get("completion_entropy"))

    def unit_weights(self, batch: Rollout, units: slice = slice(None)) -> Tensor | None:
        """AGRPO's Monte Carlo weights of the units (those of the steps the pass drew); None otherwise."""
        if self.cfg.estimator != "agrpo":
            return None
        return agrpo_unit_weights(self.estimator_inputs(batch))[:, units]

    def logprob_bounds(self, model: nn.Module, batch: Rollout,
                       units: slice = slice(None)) -> tuple[Tensor, Tensor]:
        """SPG's lower and upper per-unit terms [B, u] (`bound_estimators.sandwich_bounds`), fp32."""
        if self.cfg.estimator != "spg":
            raise ValueError(f"policy.estimator={self.cfg.estimator!r} gives log-probs, not SPG's bounds: use spg")
        views = self.estimate(self.estimator_inputs(batch))
        used = used_width(batch.unit_mask)
        mask = batch.unit_mask[:, :used]
        each = list(self._each_view(model, batch.extras, views, used, None, False))
        logps = torch.stack([lp for _, _, lp, _ in each])
        scored = torch.stack([s for _, s, _, _ in each]) & mask.to(logps.device).bool()
        lower, upper = sandwich_bounds(logps, scored, mask.sum(1).to(logps.device), self.cfg.spg_beta,
                                       self.cfg.spg_negative, self.cfg.spg_mix_weight)
        width = batch.num_units
        return (full_width(lower * mask.to(lower.device), None, width, units)[0],
                full_width(upper * mask.to(upper.device), None, width, units)[0])

    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """logp_u = sum_v 1[u in S_v] w_v log p(y_u | view v) (estimators.py), fp32."""
        ex = batch.extras
        views = self.estimate(self.estimator_inputs(batch))
        used = used_width(batch.unit_mask)  # columns past every row's end are not scored
        head = output_head_for(model, self.cfg, self.parallel, logger)
        logp, ent = self._estimate(model, ex, views, used, head, with_entropy)
        mask = batch.unit_mask[:, :used].to(logp.device)
        if head is not None and self.cfg.logprob_check and not self._logprobs_checked:
            self._logprobs_checked = True  # the run's first micro-batch on this process
            plain = self._plain_estimate(model, ex, views, used)
            compare_paths(logp.detach(), plain, mask, check_tolerance(self.cfg, head), logger)
        return full_width(logp * mask, ent * mask if ent is not None else None, ex["completion_ids"].shape[1], units)

    @torch.no_grad()
    def _plain_estimate(self, model: nn.Module, ex: dict[str, Any], views: list[View], used: int) -> Tensor:
        """The estimator's log-probs [B, used] from the model's logits, one row at a time: the check's
        logits are one row's [C, V] per view, not the micro-batch's, beside the training pass."""
        rows = ex["completion_ids"].shape[0]
        out = []
        for i in range(rows):
            idx = torch.tensor([i])
            row_views = [replace(v, masked=v.masked[i:i + 1], prompt_masked=v.prompt_masked[i:i + 1],
                                 weight=v.weight[i:i + 1], scored=None if v.scored is None else v.scored[i:i + 1])
                         for v in views]
            out.append(self._estimate(model, {k: take_rows(v, idx, rows) for k, v in ex.items()}, row_views, used,
                                      None, False)[0])
        return torch.cat(out)

    def _estimate(self, model: nn.Module, ex: dict[str, Any], views: list[View], used: int, head: OutputHead | None,
                  with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """The estimator's log-probs [B, used] over its views (and the mean entropy where scored)."""
        rows = ex["completion_ids"].shape[0]
        device = next(model.parameters()).device
        logp = torch.zeros(rows, used, device=device)
        ent = torch.zeros(rows, used, device=device) if with_entropy else None
        hits = torch.zeros(rows, used, device=device)
        for view, scored, lp, e in self._each_view(model, ex, views, used, head, with_entropy, skip_empty=True):
            logp = logp + torch.where(scored, lp * view.weight[:, None].to(device), 0.0)
            hits = hits + scored
            if ent is not None:
                ent = ent + torch.where(scored, e, 0.0)
        return logp, (ent / hits.clamp(min=1) if ent is not None else None)

    def _each_view(self, model: nn.Module, ex: dict[str, Any], views: list[View], used: int, head: OutputHead | None,
                   with_entropy: bool, skip_empty: bool = False) -> Iterator[tuple[View, Tensor, Tensor, Tensor | None]]:
        """Per view: the view, the positions it scores [B, used] (bool), their log-probs and entropies [B, used];
        with `skip_empty`, the views that score none of the first `used` columns are not run."""
        prompt_ids, prompt_mask, completion_ids = ex["prompt_ids"], ex["prompt_mask"], ex["completion_ids"]
        rows, width = completion_ids.shape
        plen = prompt_ids.shape[1]
        attention = torch.cat([prompt_mask, torch.ones(rows, width, dtype=prompt_mask.dtype)], dim=1)
        positions = torch.arange(plen, plen + used)
        device = next(model.parameters()).device
        for view in views:
            scored = view.scores[:, :used].to(device)
            if skip_empty and not scored.any():
                continue
            ids = torch.cat([prompt_ids.masked_fill(view.prompt_masked, self.mask_id),
                             completion_ids.masked_fill(view.masked, self.mask_id)], dim=1)
            lp, e = self._view_logprobs(model, ids, attention, positions, completion_ids[:, :used].to(device), scored,
                                        head, with_entropy, view.temperature)
            yield view, scored, lp, e

    def _view_logprobs(self, model: nn.Module, ids: Tensor, attention: Tensor, positions: Tensor, targets: Tensor,
                       scored: Tensor, head: OutputHead | None, with_entropy: bool,
                       temperature: float = 1.0) -> tuple[Tensor, Tensor | None]:
        """Log-probs [B, K] (and entropies) of `targets` at `positions` of one view's canvas `ids`,
        at logits / `temperature`: from the logits, or through `head` from the hidden states of the
        `scored` positions only (0 at the others)."""
        if head is None:
            return selective_log_softmax(self.logits(model, ids, attention, positions), targets,
                                         with_entropy=with_entropy, temperature=temperature)
        with head.passing_hidden_states():
            hidden = self.logits(model, ids, attention, positions)  # the head passes its input: [B, K, H]
        lp, e = head.logprobs(hidden[scored], targets[scored], temperature, self.cfg.logprob_chunk_tokens,
                              with_entropy)
        zeros = torch.zeros(scored.shape, device=lp.device)
        return zeros.masked_scatter(scored, lp), (zeros.masked_scatter(scored, e) if with_entropy else None)
