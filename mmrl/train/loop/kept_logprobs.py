"""The no-grad passes before a step's first update: the old log-probs (kept when the ratio moves
over several passes, and the old unit means for FlowDPPO's trust region), the reference's and the
distillation teacher's divergence, each taken in the same micro-batch layout as training, so that
the first pass's on-policy ratio is exactly 1."""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from typing import Callable

import torch
from torch import Tensor, nn

from mmrl.core.distillation import generalized_jsd, sampled_reverse_kl
from mmrl.core.regularisers import reference_pass
from mmrl.core.rollout import Rollout
from mmrl.serving.teacher_client import ServedTeacher
from mmrl.train.loop.records import StepBatch

UnitScore = Callable[[Rollout, slice], tuple[Tensor, Tensor | None]]


class KeptLogprobs:
    """The half of `PolicyUpdate` (loop/update.py) that runs without gradients: its strategy,
    policy, model, reference, teachers, clock, cfg and `unit_slices`."""

    @contextmanager
    def reference_model(self):
        """The reference module: the frozen copy, or the model with its LoRA adapter disabled."""
        if self.reference is not None:
            yield self.reference
        else:
            with self.strategy.unwrap(self.model).disable_adapter():
                yield self.model

    def no_grad_logprobs(self, batch: StepBatch, chunks: list[Tensor], reference: bool) -> Tensor:
        """Old (or reference) log-probs of every row, in the same micro-batch layout as training,
        so that the on-policy ratio of the first pass is exactly 1."""
        return self._no_grad_units(batch, chunks, reference, with_means=False)[0]

    def old_logprobs_and_means(self, batch: StepBatch, chunks: list[Tensor]) -> tuple[Tensor, Tensor | None]:
        """The old log-probs [N, U] and the old policy's unit means [N, U, ...] (`algorithm.trust_region:
        dppo`), taken together before the first update pass and kept for every pass."""
        return self._no_grad_units(batch, chunks, False, with_means=True)

    @torch.no_grad()
    def _no_grad_units(self, batch: StepBatch, chunks: list[Tensor], reference: bool,
                       with_means: bool) -> tuple[Tensor, Tensor | None]:
        def score(mb: Rollout, units: slice) -> tuple[Tensor, Tensor | None]:
            if reference:
                with self.reference_model() as ref:
                    return self.policy.logprobs(ref, mb, units)[0], None
            if with_means:
                return self.policy.logprobs_and_means(self.model, mb, units)
            return self.policy.logprobs(self.model, mb, units)[0], None

        model = self.reference if reference and self.reference is not None else self.model
        with self.strategy.gathered(model):
            return self._units_in_layout(batch, chunks, score)

    def _units_in_layout(self, batch: StepBatch, chunks: list[Tensor], score: UnitScore) -> tuple[Tensor, Tensor | None]:
        """`score(micro-batch, units)` -> (values [b, u], optional means [b, u, ...]) of every row, in the
        training micro-batch layout (padded passes at zero keep the processes in step), as [N, U] on the CPU."""
        local = batch.rollout
        out, means = torch.zeros_like(local.unit_mask, dtype=torch.float32), None
        source = local if len(local) else batch.idle_row
        with self.clock.phase("forward"):
            for rows in chunks:
                padding = len(rows) == 0 or len(local) == 0  # a pass at zero, only to keep the processes in step
                if padding and not self.strategy.forwards_in_step:
                    continue
                mb = source.select(rows if not padding else [0])
                for units, _ in self.unit_slices(mb, in_step=self.strategy.forwards_in_step):
                    values, unit_mean = score(mb, units)
                    if padding:
                        continue
                    cols = torch.arange(out.shape[1])[units].unsqueeze(0)
                    out[rows.unsqueeze(1), cols] = values.float().cpu()
                    if unit_mean is not None:
                        if means is None:
                            means = torch.zeros(*out.shape, *unit_mean.shape[2:])
                        means[rows.unsqueeze(1), cols] = unit_mean.float().cpu()
        return out, means

    def teacher_divergence_of(self, teacher: nn.Module | ServedTeacher, mb: Rollout, units: slice) -> Tensor:
        """Each unit's divergence [b, u] of the student (the trained model as it is now) from `teacher`
        on the rows `mb` (`algorithm.distill.divergence`; mmrl/core/distillation.py)."""
        distill = self.cfg.algorithm.distill
        if isinstance(teacher, ServedTeacher):  # sampled: its log-probs of the student's units
            student = self.policy.logprobs(self.model, mb, units)[0]
            return sampled_reverse_kl(student, teacher.logprobs(mb, units).to(student.device))
        if distill.divergence == "closed_form":
            return self.policy.logprobs_and_kl(self.model, lambda: nullcontext(teacher), mb, units)[2]
        if distill.divergence == "jsd":
            return generalized_jsd(self.policy.unit_logits(self.model, mb, units),
                                   self.policy.unit_logits(teacher, mb, units), distill.beta)
        return sampled_reverse_kl(self.policy.logprobs(self.model, mb, units)[0],
                                  self.policy.logprobs(teacher, mb, units)[0])

    @torch.no_grad()
    def teacher_divergence(self, batch: StepBatch, chunks: list[Tensor]) -> Tensor:
        """Each unit's divergence [N, U] of the student at the step's start from its row's teacher, on
        the student's rollouts."""
        def score(mb: Rollout, units: slice) -> tuple[Tensor, None]:
            return self.teachers.routed(mb, lambda teacher, rows: self.teacher_divergence_of(teacher, rows, units),
                                        self.strategy.forwards_in_step), None

        with ExitStack() as gathered:
            for module in (self.model, *self.teachers.in_process()):
                gathered.enter_context(self.strategy.gathered(module))
            return self._units_in_layout(batch, chunks, score)[0]

    def _old_and_reference(self, batch: StepBatch, chunks: list[Tensor], passes: list[StepBatch], redrawn: bool):
        """Per pass: the old log-probs (kept when the ratio moves over several passes), the reference's,
        and the old unit means (`algorithm.trust_region: dppo`; None otherwise)."""
        algo = self.cfg.algorithm

        def per_pass(reference: bool) -> list[Tensor]:
            if not redrawn:
                return [self.no_grad_logprobs(batch, chunks, reference)] * algo.mu
            return [self.no_grad_logprobs(p, chunks, reference) for p in passes]

        keep_old = algo.mu > 1 and self.objective.uses_ratio
        old_means = [None] * algo.mu
        if keep_old and algo.trust_region == "dppo":
            kept = ([self.old_logprobs_and_means(p, chunks) for p in passes] if redrawn
                    else [self.old_logprobs_and_means(batch, chunks)] * algo.mu)
            old_logp, old_means = [k[0] for k in kept], [k[1] for k in kept]
        else:
            old_logp = per_pass(reference=False) if keep_old else [None] * algo.mu
        ref_logp = per_pass(reference=True) if reference_pass(algo) else [None] * algo.mu
        return old_logp, ref_logp, old_means
