"""The denoising-step units under grad (`policy.units: steps`): for each trained step of a batch of
rollouts, the step's mean under a model (the denoiser's prediction through the sampler), its
log-prob in the configured form (`policy.cps_logprob`), its constant entropy, the closed-form KL
to the reference (`policy.kl_form`; or UniGRPO's velocity MSE in its place) and FlowDPPO's divergence from the old means, each forwarded
on the rows that train the step only (`unit_rows.py`). `StepUnits` computes them into a
`StepTerms` record, in step order; the adapter's `logprobs*` methods are views of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout

from .config import DiffusionConfig
from .family import Family
from .samplers import LOGPROB_FORMS, SAMPLERS, flow_grpo_kl_factor, gaussian_mean_kl, velocity_mse
from .unit_rows import Reference, on_rows, rows_conditioning, unit_rows, untrained


@dataclass
class StepTerms:
    """Per trained step of a batch, in step order: log-probs [B], constant entropies, detached
    means [B, ...], KLs to the reference [B] and divergences from the old means [B]."""

    logps: list[Tensor] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    means: list[Tensor] = field(default_factory=list)
    kls: list[Tensor] = field(default_factory=list)
    divergences: list[Tensor] = field(default_factory=list)

    def logp(self) -> Tensor:
        return torch.stack(self.logps, 1)

    def entropy(self) -> Tensor:
        logp = self.logp()
        return torch.tensor(self.entropies, device=logp.device).expand_as(logp)

    @staticmethod
    def stacked(values: list[Tensor]) -> Tensor | None:
        """[B, u, ...] of the steps' values, or None where none was computed."""
        return torch.stack(values, 1) if values else None


class StepUnits:
    """The step units of rollouts drawn by `family` under settings `cfg`."""

    def __init__(self, family: Family, cfg: DiffusionConfig):
        self.family, self.cfg = family, cfg

    def means(self, model: nn.Module, batch: Rollout, k: int, rows: Tensor,
              device: torch.device) -> tuple[Tensor, float]:
        """(mean of step k under `model` [r, ...], the step's std) for rows `rows` of a batch of rollouts."""
        return self.step(batch, k, rows, *self.prediction(model, batch, k, rows, device))

    def prediction(self, model: nn.Module, batch: Rollout, k: int, rows: Tensor,
                   device: torch.device) -> tuple[Tensor, Tensor]:
        """(latents before step k [r, ...], `model`'s prediction there [r, ...]: a flow model's velocity)."""
        ex, cfg = batch.extras, self.cfg
        x = ex["latents"][rows, k].to(device)
        cond = rows_conditioning(batch, rows, device)
        return x, self.family.predict(model, x, ex["timesteps"][0, k], cond, cfg.guidance_scale,
                                      cfg.classifier_free_guidance)

    def step(self, batch: Rollout, k: int, rows: Tensor, x: Tensor, pred: Tensor) -> tuple[Tensor, float]:
        """(the sampler's mean of step k [r, ...] from `x` and the prediction `pred`, the step's std)."""
        levels = batch.extras["levels"][0].tolist()
        # rows that took the ODE at step k are never trained there: their SDE mean is masked out
        strength = self.cfg.noise_level if bool(batch.extras["stochastic"][rows, k].any()) else 0.0
        return SAMPLERS.get(self.cfg.sampler)(x.float(), pred.float(), levels[k], levels[k + 1], strength)

    def logprob(self, sample: Tensor, mean: Tensor, std: float) -> Tensor:
        """The step's log-prob in the configured form (`policy.cps_logprob`)."""
        return LOGPROB_FORMS[self.cfg.cps_logprob](sample, mean, std)

    def kl(self, mean: Tensor, ref_mean: Tensor, std: float, batch: Rollout, k: int) -> Tensor:
        """The step's closed-form KL, exact or in Flow-GRPO's form (`policy.kl_form`)."""
        kl = gaussian_mean_kl(mean, ref_mean, std)
        if self.cfg.kl_form == "flow_grpo":
            levels = batch.extras["levels"][0]
            kl = kl * flow_grpo_kl_factor(self.cfg.sampler, float(levels[k]), float(levels[k + 1]))
        return kl

    def terms(self, model: nn.Module, batch: Rollout, units: slice, device: torch.device, sharded: bool,
              reference: Reference | None = None, old_means: Tensor | None = None,
              keep_means: bool = False) -> StepTerms:
        """The terms of each unit of `units`, computed on the rows that train it, 0 elsewhere: with
        `reference` the KL, with `old_means` [B, u, ...] the divergence, with `keep_means` the means."""
        terms, n = StepTerms(), len(batch)
        for j, (k, rows) in enumerate(unit_rows(batch, units, sharded)):
            if not len(rows):
                self._add_untrained(terms, batch, device, keep_means, reference is not None, old_means is not None)
                continue
            x, pred = self.prediction(model, batch, k, rows, device)
            mean, std = self.step(batch, k, rows, x, pred)
            if std > 0:
                logp = self.logprob(batch.extras["latents"][rows, k + 1].to(mean.device), mean, std)
            else:  # an ODE step is never a trained unit: a constant 0 that keeps the graph
                logp = mean.flatten(1)[:, 0] * 0.0
            terms.logps.append(on_rows(logp, rows, n))
            # a Gaussian with a fixed std has a constant entropy per dim: 0.5 log(2 pi e std^2)
            terms.entropies.append(0.5 * math.log(2 * math.pi * math.e * std ** 2) if std > 0 else 0.0)
            if keep_means:
                terms.means.append(on_rows(mean.detach(), rows, n))
            if reference is not None:
                with torch.no_grad(), reference() as ref:
                    ref_pred = self.prediction(ref, batch, k, rows, device)[1]
                if self.cfg.kl_form == "velocity_mse":  # UniGRPO: the velocities' MSE in place of the KL
                    kl = velocity_mse(pred, ref_pred) if std > 0 else logp * 0.0
                else:
                    ref_mean = self.step(batch, k, rows, x, ref_pred)[0]
                    kl = self.kl(mean, ref_mean, std, batch, k) if std > 0 else logp * 0.0
                terms.kls.append(on_rows(kl, rows, n))
            if old_means is not None:  # FlowDPPO's divergence: the exact KL whatever policy.kl_form says
                old = old_means[rows, j].to(mean.device)
                divergence = gaussian_mean_kl(old, mean, std) if std > 0 else logp * 0.0
                terms.divergences.append(on_rows(divergence, rows, n))
        return terms

    @staticmethod
    def _add_untrained(terms: StepTerms, batch: Rollout, device: torch.device, means: bool, kl: bool,
                       divergence: bool) -> None:
        """The terms of a unit no row trains: zeros, no forward."""
        n = len(batch)
        terms.logps.append(untrained(device, n))
        terms.entropies.append(0.0)
        if means:
            terms.means.append(untrained(device, n, *batch.extras["latents"].shape[2:]))
        if kl:
            terms.kls.append(untrained(device, n))
        if divergence:
            terms.divergences.append(untrained(device, n))
