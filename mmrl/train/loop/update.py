"""The update passes of a step: `mu` optimizer steps over streamed micro-batches, old and reference
log-probs kept from before the first, the rollout/training mismatch measured and corrected, non-finite
steps skipped. Everything that depends on the distribution goes through the run's `Strategy`."""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor, nn

from mmrl.config.sections import TrainConfig
from mmrl.core.advantages import row_magnitude
from mmrl.core.distillation import distilled_advantages
from mmrl.core.objectives import ratio_segments
from mmrl.core.policy import Policy
from mmrl.core.regularisers import closed_form_kl, metric_names, regulariser_needs
from mmrl.core.rollout import Rollout
from mmrl.core.rollout_correction import add_sums, importance_weights, mismatch_metrics, mismatch_sums
from mmrl.distributed.gather import gather_objects
from mmrl.distributed.strategy import Strategy
from mmrl.errors import UserError
from mmrl.train.loop.kept_logprobs import KeptLogprobs
from mmrl.train.loop.records import MicroBatchCounts, StepBatch
from mmrl.train.loop.score_pair import ScorePair
from mmrl.train.loop.step_clock import StepClock
from mmrl.train.loop.teachers import Teachers

MISMATCH_SUMS = {"rollout_units": 0.0, "rollout_diff_sum": 0.0, "rollout_capped": 0.0, "rollout_diff_max": 0.0}


class PolicyUpdate(KeptLogprobs):
    """Updates `model` (the policy's trained module, as the strategy prepared it) from step batches.
    `cfg` is the current stage's recipe (the trainer replaces it when a stage starts)."""

    def __init__(self, cfg: TrainConfig, strategy: Strategy, policy: Policy, model: nn.Module,
                 optimizer: torch.optim.Optimizer, scheduler, reference: nn.Module | None, objective, clock: StepClock,
                 teachers: Teachers | None = None, scores: ScorePair | None = None):
        self.cfg, self.strategy, self.policy, self.model = cfg, strategy, policy, model
        self.optimizer, self.scheduler, self.reference, self.objective = optimizer, scheduler, reference, objective
        self.teachers = teachers  # the frozen distillation teachers (algorithm.distill), None without any
        self.scores = scores  # distribution matching's real and fake scores, None without it
        self.clock = clock  # the phases of the step's update: forward, backward, optimizer
        self.nonfinite_term: str | None = None  # of the latest step: "loss", "gradient norm" or None

    def micro_batches(self, batch: StepBatch) -> list[Tensor]:
        """Row indices of each micro-batch. Rows without gradient (zero advantage, and no active
        regulariser that needs every row) are skipped; every process runs the same number of micro-batches (padded
        with empty ones) so gradient synchronisation lines up."""
        active = batch.row_mask.clone()
        if not regulariser_needs(self.cfg.algorithm, "all_rows") and not self.cfg.algorithm.distill.active:
            active &= row_magnitude(batch.advantages) > 0
        rows = active.nonzero().flatten()
        size = self.cfg.optim.micro_batch_size
        chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
        counts: list[MicroBatchCounts] = gather_objects(self.strategy.acc, MicroBatchCounts(
            len(chunks), int(active.sum()), int(batch.row_mask.sum())))
        chunks += [rows[:0]] * (max(c.chunks for c in counts) - len(chunks))
        batch.metrics["skipped_frac"] = 1.0 - sum(c.active for c in counts) / max(sum(c.rows for c in counts), 1)
        return chunks

    def unit_slices(self, mb: Rollout, in_step: bool = False) -> list[tuple[slice, list[slice] | None]]:
        """The units each backward covers, with the ratio segments inside them (chunk level);
        `in_step`: every process takes the same (its passes are collectives), which every process
        must then ask for alike."""
        algo = self.cfg.algorithm
        if algo.ratio_level == "sequence" or regulariser_needs(algo, "whole_rows"):
            return [(slice(None), None)]
        if algo.ratio_level == "chunk":
            segs = ratio_segments("chunk", mb.num_units, algo.chunks)
            if not in_step:  # the chunks a row trains (else the first); in step: all, as many passes
                segs = [s for s in segs if mb.unit_mask[:, s].any()] or segs[:1]
            return [(s, [slice(0, s.stop - s.start)]) for s in segs]
        slices = self.policy.unit_slices(mb)
        if in_step:
            slices = self._slices_of_every_process(slices)
        return [(s, None) for s in slices]

    def _slices_of_every_process(self, slices: list[slice]) -> list[slice]:
        """The union of every process's slices, in unit order. Where they differ (a diffusion
        micro-batch's trained steps depend on its rows) they must be single units, or a unit would be
        trained twice."""
        mine = [(s.start, s.stop) for s in slices]
        every = gather_objects(self.strategy.acc, mine)
        if all(theirs == mine for theirs in every):
            return slices
        union = sorted({bounds for theirs in every for bounds in theirs}, key=lambda b: (b[0] or 0))
        if any(start is None or stop != start + 1 for start, stop in union):
            raise UserError(f"the processes split a micro-batch's units differently ({every}); "
                            f"{type(self.policy).__name__}.unit_slices must give single units where it does")
        return [slice(start, stop) for start, stop in union]

    def _micro_batch_terms(self, batch: StepBatch, idx: Tensor, units: slice, segs, old_logp: Tensor | None,
                           ref_logp: Tensor | None, with_entropy: bool, sums: dict[str, float], empty: bool,
                           old_means: Tensor | None = None):
        """Forward and loss of rows `idx` over `units` (the mismatch sums added to `sums`)."""
        algo = self.cfg.algorithm
        mb = batch.rollout.select(idx)
        if self.objective.unit_terms == "implicit_velocity":
            return self._implicit_velocity_terms(batch, idx, mb, units)
        if self.objective.unit_terms == "logprob_bounds":
            return self._bound_terms(batch, idx, mb, units)
        want_entropy = with_entropy or regulariser_needs(algo, "entropy")
        kl = divergence = None
        if old_means is not None:  # trust_region dppo with kept old means
            logp, entropy, kl, divergence = self.policy.logprobs_and_divergence(
                self.model, mb, units, old_means[idx][:, units], self.reference_model if closed_form_kl(algo) else None,
                with_entropy=want_entropy)
        elif closed_form_kl(algo):
            logp, entropy, kl = self.policy.logprobs_and_kl(self.model, self.reference_model, mb, units,
                                                            with_entropy=want_entropy)
        else:
            logp, entropy = self.policy.logprobs(self.model, mb, units, with_entropy=want_entropy)
        device = logp.device
        adv = batch.advantages[idx]
        old = old_logp[idx][:, units].to(device) if old_logp is not None else logp.detach()
        mask = mb.unit_mask[:, units].to(device) * batch.row_mask[idx, None].to(device)
        is_weight = capped = None
        sampled = self.policy.unit_weights(mb, units)  # the units this pass trains, with their weights
        if sampled is not None:
            mask, is_weight = mask * (sampled.to(device) > 0), sampled.to(device)
        if self.objective.uses_ratio and (own := self.policy.unit_clip(mb, units, (algo.eps_low, algo.eps_high))):
            own_clip = {"clip_range": tuple(e.to(device) for e in own)}
        else:
            own_clip = {}
        if mb.rollout_logp is not None:
            rollout_logp = mb.rollout_logp[:, units].to(device)
            if algo.rollout_correction != "none":
                correction, capped = importance_weights(old, rollout_logp, algo.rollout_correction,
                                                        algo.rollout_correction_cap)
                is_weight = correction if is_weight is None else is_weight * correction
            if not empty:
                add_sums(sums, mismatch_sums(old, rollout_logp, mask, capped))
        return self.objective.loss(
            logp, old, (adv[:, units] if adv.dim() == 2 else adv).to(device), mask,
            batch.weights[idx][:, units].to(device), algo, segments=segs,
            ref_logp=ref_logp[idx][:, units].to(device) if ref_logp is not None else None,
            entropy=entropy, kl=kl, **own_clip, **({"is_weight": is_weight} if is_weight is not None else {}),
            **({"step_scales": [s.to(device) for s in self.policy.step_scales(mb, units)]}
               if algo.ratio_norm != "none" else {}),
            **({"divergence": divergence} if divergence is not None else {}),
            **({"distill": self.teacher_divergence_under_grad(mb, units)} if algo.distill.active
               and algo.distill.form == "loss" else {}),
            **({"dmd": self.scores.unit_losses(self.model, mb, units)} if self.scores is not None else {}))

    def teacher_divergence_under_grad(self, mb: Rollout, units: slice) -> Tensor:
        """Each unit's divergence [b, u] from its row's teacher, differentiated through the student
        (`algorithm.distill.form: loss`; a forward of its own beside the log-probs')."""
        return self.teachers.routed(mb, lambda teacher, rows: self.teacher_divergence_of(teacher, rows, units),
                                    self.strategy.lockstep)

    def _implicit_velocity_terms(self, batch: StepBatch, idx: Tensor, mb: Rollout, units: slice):
        """The loss of rows `idx` over `units` from the adapter's implicit-velocity losses (nft)."""
        algo = self.cfg.algorithm
        reference = self.reference_model if closed_form_kl(algo) else None
        positive, negative, kl = self.policy.implicit_velocity_losses(self.model, mb, units, algo.nft_beta,
                                                                     reference)
        device = positive.device
        mask = mb.unit_mask[:, units].to(device) * batch.row_mask[idx, None].to(device)
        return self.objective.loss(positive, negative, batch.advantages[idx].to(device), mask,
                                   batch.weights[idx][:, units].to(device), algo, kl=kl)

    def _bound_terms(self, batch: StepBatch, idx: Tensor, mb: Rollout, units: slice):
        """The loss of rows `idx` over `units` from the adapter's log-likelihood bounds (spg)."""
        lower, upper = self.policy.logprob_bounds(self.model, mb, units)
        mask = mb.unit_mask[:, units].to(lower.device) * batch.row_mask[idx, None].to(lower.device)
        return self.objective.loss(lower, upper, batch.advantages[idx].to(lower.device), mask,
                                   batch.weights[idx][:, units].to(lower.device), self.cfg.algorithm)

    def _check_rollout_logp(self, local: Rollout) -> dict[str, float]:
        """The mismatch sums to report (none without sampler log-probs), or a clear error where the
        recipe corrects a mismatch the adapter cannot measure."""
        algo = self.cfg.algorithm
        if local.rollout_logp is not None:  # the rollout-vs-training gap is measured (mmrl/core/rollout_correction.py)
            return dict(MISMATCH_SUMS)
        if algo.rollout_correction != "none" and len(local):
            raise UserError(f"algorithm.rollout_correction={algo.rollout_correction!r} needs the rollout sampler's "
                            f"log-probs, and the {self.cfg.task!r} adapter's rollouts under this policy section "
                            "record none (Rollout.rollout_logp); set algorithm.rollout_correction: none")
        return {}

    def accumulate_gradients(self, batch: StepBatch, chunks: list[Tensor], old_logp: Tensor | None,
                             ref_logp: Tensor | None, with_entropy: bool,
                             old_means: Tensor | None = None) -> dict[str, float]:
        """One pass over the micro-batches: forward, loss, backward, free; gradients accumulate
        into `.grad` and are synchronised across processes on the last backward. `old_means`, under
        `algorithm.trust_region: dppo`, are the old policy's unit means (None: the current policy's)."""
        strategy, local = self.strategy, batch.rollout
        world = strategy.acc.num_processes
        sums = {"loss": 0.0, "units": 0.0, "clipped": 0.0, "ratio_max_dev": 0.0, **{k: 0.0 for k in metric_names()},
                **self._check_rollout_logp(local)}
        if len(local) == 0 and not strategy.lockstep:  # this process kept no rows: synchronise at zero
            strategy.backward(self.model, sum(p.sum() for p in self.model.parameters() if p.requires_grad) * 0.0, True)
            return sums
        idle = len(local) == 0  # lockstep: as many forward and backward passes as the others, at zero
        source = batch.idle_row if idle else local
        work = [(rows, units, segs) for rows in chunks
                for units, segs in self.unit_slices(source.select(rows if len(rows) else [0]), strategy.lockstep)]
        for k, (rows, units, segs) in enumerate(work):
            empty = len(rows) == 0  # padding so every process runs as many backward passes
            idx = rows if not empty else torch.tensor([0])
            last = k == len(work) - 1
            if idle:
                with self.clock.phase("forward"):
                    logp, _ = self.policy.logprobs(self.model, source.select(idx), units)
                with self.clock.phase("backward"):
                    strategy.backward(self.model, logp.sum() * 0.0, last)
                continue
            with strategy.no_sync(self.model, last):
                with self.clock.phase("forward"):
                    terms = self._micro_batch_terms(batch, idx, units, segs, old_logp, ref_logp, with_entropy, sums,
                                                    empty, old_means)
                with self.clock.phase("backward"):
                    strategy.backward(self.model, terms.loss * (0.0 if empty else float(world)), last)
            if not empty:
                add_terms(sums, terms)
        return sums

    def update(self, batch: StepBatch) -> dict[str, float]:
        """`mu` optimizer steps on the batch, old log-probs kept from before the first. A policy
        whose log-probs are redrawn each pass (`Policy.pass_view`) gets the old and reference
        log-probs of every pass from that pass's own view, all before the first step."""
        algo, strategy = self.cfg.algorithm, self.strategy
        chunks = self.micro_batches(batch)
        if self.cfg.algorithm.distill.active and self.cfg.algorithm.distill.form == "advantage":
            batch = self.distilled(batch, chunks)
        if self.scores is not None:  # the fake score's updates first: it follows the samples of this step's student
            batch = self.scores.prepared(batch, chunks, self.model)
        views = [self.policy.pass_view(batch.rollout, k) for k in range(algo.mu)]
        passes = [batch if view is None else replace(batch, rollout=view) for view in views]
        old_logp, ref_logp, old_means = self._old_and_reference(batch, chunks, passes,
                                                                any(v is not None for v in views))
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm, first = 0.0, None
        self.nonfinite_term = None
        for pass_index in range(algo.mu):
            sums = self.accumulate_gradients(passes[pass_index], chunks, old_logp[pass_index], ref_logp[pass_index],
                                             with_entropy=pass_index == 0, old_means=old_means[pass_index])
            first = first or sums
            self.nonfinite_term = self._nonfinite_term(sums["loss"], params)
            with self.clock.phase("optimizer"):
                if self.nonfinite_term is not None:  # skip this optimizer step (and the step's later passes)
                    grad_norm = strategy.drop_gradients(self.model, self.optimizer, params)
                    break
                grad_norm = strategy.step(self.model, self.optimizer, params)
        self.scheduler.step()
        return self._metrics(first, grad_norm)

    def distilled(self, batch: StepBatch, chunks: list[Tensor]) -> StepBatch:
        """The batch with the distillation signal in its advantages [n, U] (`algorithm.distill`), and the
        mean divergence of its units from the teacher logged as `distill_divergence`."""
        distill = self.cfg.algorithm.distill
        if self.teachers is None:
            raise UserError("algorithm.distill.teacher is set in a later stage only: the teacher is built with "
                            "the run, so name it in the recipe's own algorithm.distill")
        divergence = self.teacher_divergence(batch, chunks)
        mask = batch.rollout.unit_mask.float() * batch.row_mask[:, None].float()
        advantages = distilled_advantages(batch.advantages if distill.with_reward else None, divergence, mask,
                                          distill.weight)
        sums = gather_objects(self.strategy.acc, (float((divergence * mask).sum()), float(mask.sum())))
        batch.metrics["distill_divergence"] = sum(s[0] for s in sums) / max(sum(s[1] for s in sums), 1.0)
        return replace(batch, advantages=advantages)

    def _metrics(self, first: dict[str, float], grad_norm: float) -> dict[str, float]:
        """The first pass's sums over every process, as logged."""
        gathered = gather_objects(self.strategy.acc, first)
        total = {k: sum(g.get(k, 0.0) for g in gathered) for k in first}
        units = total["units"] or math.nan  # nan: every row was skipped, nothing was measured
        regularisers = {logged: total[key] / units if per_unit else total[key]
                        for key, (logged, per_unit) in metric_names().items()}
        return {"loss": total["loss"], "clip_frac": total["clipped"] / units, **regularisers,
                "ratio_max_dev": max(g["ratio_max_dev"] for g in gathered), "grad_norm": grad_norm,
                "lr": self.scheduler.get_last_lr()[0], "nonfinite_skipped": float(self.nonfinite_term is not None),
                **mismatch_metrics(gathered, self.cfg.algorithm.rollout_correction)}

    def _nonfinite_term(self, loss: float, params: list[Tensor]) -> str | None:
        """'loss' or 'gradient norm' if either is NaN/inf on any process, else None (all agree)."""
        term = None
        if not math.isfinite(loss):
            term = "loss"
        elif not self.strategy.gradients_finite(self.model, params):
            term = "gradient norm"
        return next((t for t in gather_objects(self.strategy.acc, term) if t is not None), None)


def add_terms(sums: dict[str, float], terms) -> None:
    """A micro-batch's `LossTerms` added to the pass's sums."""
    for key in ("units", "clipped"):
        sums[key] += getattr(terms, key)
    for key, value in terms.metrics.items():
        sums[key] += value
    sums["loss"] += terms.loss.item()
    sums["ratio_max_dev"] = max(sums["ratio_max_dev"], terms.ratio_max_dev)
