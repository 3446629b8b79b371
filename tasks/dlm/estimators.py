"""Log-prob estimators of a masked diffusion LM's completion tokens (the policy's units).

A masked diffusion LM has no tractable log pi(y | x); RL methods score each completion token from
one or more *views*: copies of (prompt, completion) with some positions replaced by the mask
token. View v scores the completion positions S_v it masked, with a per-row weight w_v, and the
unit log-prob of token u is

    logp_u = sum_v 1[u in S_v] * w_v * log p_theta(y_u | view v)        (fp32 log-softmax)

(a view may score only some of the positions it masks: `View.scored`, and divide its logits by
a temperature: `View.temperature`). Every random choice (masks, time points, steps) comes from a
generator seeded with the row's mask seed and the update pass (`view_seed`), never from the global
RNG: the old log-probs of a pass use the very masks of that pass, so the on-policy ratio is exactly
1, and a row's views do not depend on which rows share its micro-batch.

Registered estimators (`policy.estimator`): the three below, SPG's and ESPO's
(`bound_estimators.py`), TraceRL's and AGRPO's (`trajectory_estimators.py`).

* ``diffu_grpo`` (d1, Zhao et al. 2025): one view, completion fully masked, each prompt token
  masked with probability `p_mask`; w = 1. Cost: 1 forward. Bias: the mean-field one-step
  likelihood log p(y_u | x with y masked) ignores the dependence between completion tokens, so
  its sum is not log pi(y | x) (nor a bound on it); prompt masking varies the estimate between
  the mu passes (a regulariser).
* ``coupled`` (Coupled-GRPO, DiffuCoder, Gong et al. 2025): t ~ U(0.2, 0.8) per row, each
  completion token masked in view 1 with probability t and otherwise in view 2 (complementary),
  and, by default (`coupled_full_view`), a third view with the whole completion masked. As the
  paper's appendix and apple/ml-diffucoder (`selective_log_softmax`): logp_u = (log p(y_u | full
  mask) + c_u) / 2 with the coupled term c_u = log p(y_u | view 1) / t for the tokens of view 1 and
  log p(y_u | view 2) / (1 - t) for the others; i.e. weights 1/2, 1/(2t), 1/(2(1-t)). Without the
  full view, logp_u = c_u / 2 (mmrl's earlier rule): sum_u logp_u is then the mean of two
  single-view ELBO estimates at t and 1 - t. DiffuCoder draws one t for the whole batch; mmrl one
  per row (a row's views must not depend on its micro-batch). Cost: 3 forwards (2 without the
  full view). Bias: the mean-field full-mask term (as diffu_grpo's) plus the ELBO gap with t
  restricted to [0.2, 0.8]; every token is scored by every view pair exactly once.
* ``elbo`` (GDPO, Rojas et al. 2025): K = `elbo_points` views at the Gauss-Legendre nodes t_k
  of [0, 1] with weights a_k (semi-deterministic Monte Carlo: deterministic times, random masks),
  each completion token masked with probability t_k; w_k = a_k / t_k. sum_u logp_u is a
  quadrature estimate of LLaDA's ELBO E_t[(1/t) sum_{masked} log p]; use it with
  `algorithm.ratio_level: sequence` for GDPO's sequence-level ratio. Cost: K forwards. Bias: the
  ELBO gap plus the quadrature error in t (exact for polynomials of degree 2K - 1); only the
  masks are random, and the variance falls with K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from mmrl.core.seeding import derive_seed
from mmrl.registry import Registry

COUPLED_T_RANGE = (0.2, 0.8)


@dataclass
class View:
    """One masked copy of the batch: `masked` [B, C] completion positions replaced by the mask
    token, `prompt_masked` [B, P] prompt positions replaced, `weight` [B]; `scored` [B, C] the
    positions it scores (None: the masked ones), at logits / `temperature`."""

    masked: Tensor
    prompt_masked: Tensor
    weight: Tensor
    scored: Tensor | None = None
    temperature: float = 1.0

    @property
    def scores(self) -> Tensor:
        return self.masked if self.scored is None else self.scored


@dataclass
class EstimatorArgs:
    """The estimators' settings (`policy.<name>`, DLMConfig) and the decoding ones they replay."""

    p_mask: float = 0.15
    elbo_points: int = 4
    coupled_full_view: bool = True
    spg_views: int = 2
    espo_samples: int = 2
    trace_shrink: int = 1
    agrpo_samples: int = 4
    agrpo_step_sampling: str = "uniform"
    block_length: int = 32
    temperature: float = 1.0


@dataclass
class EstimatorInputs:
    """What an estimator draws its views from, for B rows of C completion columns."""

    generators: list[torch.Generator]  # one per row, seeded by `view_seed`
    prompt_mask: Tensor                # [B, P] 1 = a real prompt token (left-padded)
    width: int                         # C
    lengths: Tensor                    # [B] long: the row's units (up to and including its first EOS)
    args: EstimatorArgs
    step: Tensor | None = None         # [B, C] long: the decoding step that committed each token (rollouts)
    entropy: Tensor | None = None      # [B, C] fp32: the entropy of that step's distribution

    @property
    def rows(self) -> int:
        return len(self.generators)

    def keep_prompt(self) -> Tensor:
        """No prompt position masked [B, P]."""
        return torch.zeros(self.prompt_mask.shape, dtype=torch.bool)

    def units(self) -> Tensor:
        """[B, C] bool: the row's unit columns."""
        return torch.arange(self.width)[None, :] < self.lengths[:, None]


def estimator_args(cfg: Any) -> EstimatorArgs:
    """The estimators' settings of a `DLMConfig` (its `policy.<name>` fields)."""
    return EstimatorArgs(cfg.p_mask, cfg.elbo_points, cfg.coupled_full_view, cfg.spg_views, cfg.espo_samples,
                         cfg.trace_shrink, cfg.agrpo_samples, cfg.agrpo_step_sampling, cfg.block_length,
                         cfg.temperature)


LOGP_ESTIMATORS: Registry[Callable[[EstimatorInputs], list[View]]] = Registry("masked diffusion LM log-prob estimator")


def view_seed(mask_seed: int, pass_index: int) -> int:
    """The seed of a row's views in update pass `pass_index`."""
    return derive_seed(mask_seed, pass_index)


def _uniform(generators: list[torch.Generator], *shape: int) -> Tensor:
    """U(0, 1) of shape [B, *shape], row i from generator i."""
    return torch.stack([torch.rand(shape, generator=g) for g in generators]) if shape else \
        torch.stack([torch.rand((), generator=g) for g in generators])


@LOGP_ESTIMATORS.register("diffu_grpo")
def diffu_grpo(inputs: EstimatorInputs) -> list[View]:
    generators, prompt_mask, width, args = inputs.generators, inputs.prompt_mask, inputs.width, inputs.args
    rows, plen = prompt_mask.shape
    if not 0 <= args.p_mask < 1:
        raise ValueError(f"policy.p_mask={args.p_mask} must be in [0, 1)")
    # one draw per real prompt token (prompts are left-padded), so padding never moves the mask
    prompt_masked = torch.zeros(rows, plen, dtype=torch.bool)
    for i, (g, n) in enumerate(zip(generators, prompt_mask.sum(1).tolist())):
        prompt_masked[i, plen - n:] = torch.rand(n, generator=g) < args.p_mask
    return [View(masked=torch.ones(rows, width, dtype=torch.bool), prompt_masked=prompt_masked,
                 weight=torch.ones(rows))]


@LOGP_ESTIMATORS.register("coupled")
def coupled(inputs: EstimatorInputs) -> list[View]:
    generators, width, rows = inputs.generators, inputs.width, inputs.rows
    low, high = COUPLED_T_RANGE
    t = low + (high - low) * _uniform(generators)
    first = _uniform(generators, width) < t[:, None]
    keep = inputs.keep_prompt()
    coupled_views = [View(first, keep, 1 / (2 * t)), View(~first, keep, 1 / (2 * (1 - t)))]
    if not inputs.args.coupled_full_view:
        return coupled_views
    full = View(torch.ones(rows, width, dtype=torch.bool), keep, torch.full((rows,), 0.5))
    return [full, *coupled_views]


@LOGP_ESTIMATORS.register("elbo")
def elbo(inputs: EstimatorInputs) -> list[View]:
    generators, width, rows = inputs.generators, inputs.width, inputs.rows
    k = inputs.args.elbo_points
    if k < 1:
        raise ValueError(f"policy.elbo_points={k} must be >= 1")
    keep = inputs.keep_prompt()
    nodes, weights = np.polynomial.legendre.leggauss(k)  # on [-1, 1]
    views = []
    for x, a in zip(nodes, weights):
        t, a = (x + 1) / 2, a / 2
        masked = _uniform(generators, width) < t
        views.append(View(masked, keep, torch.full((rows,), float(a / t))))
    return views
