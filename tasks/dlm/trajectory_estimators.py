"""TraceRL's and AGRPO's estimators: each completion token scored on the canvas the decoder saw
when it committed it, replayed from the rollout's record of its decoding steps (`DecodeTrace.step`):
the view of step s masks every token committed at step s or later (later blocks included) and
scores those committed at s (docs/dlm.md has the authors' code each follows).

* ``tracerl`` (TraceRL, Wang et al. 2025, Gen-Verse/dLLM-RL `train/rl_llada.py`, method TraceRL):
  every step, the row's distinct steps merged `trace_shrink` at a time (`collapse_k_unique`: a group
  of consecutive steps is scored on the canvas before its first); each token scored once, weight 1,
  at T = 1 (`log_softmax(logits)`). Cost: steps / trace_shrink forwards.
* ``agrpo`` (AGRPO, Zhan 2025, probablyabot/agrpo `agrpo_trainer.py`): `agrpo_samples` steps drawn
  per row and update pass among steps 0..last (last: the last step that committed one of the row's
  units), uniformly, stratified over the row's draws (AGRPO's low-discrepancy sampler, over a
  row's draws rather than the batch's), or (`agrpo_step_sampling: entropy`) in proportion to the
  summed entropies of the tokens each step committed; the drawn steps are scored at the decoding
  temperature (the sampler's own log-prob), and `agrpo_unit_weights` gives each unit its Monte
  Carlo weight (the engine's `Policy.unit_weights`). Cost: agrpo_samples forwards at most.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .estimators import LOGP_ESTIMATORS, EstimatorInputs, View

AGRPO_STEP_SAMPLING = ("uniform", "entropy")


def decoding_steps(inputs: EstimatorInputs) -> Tensor:
    """The rollout's decoding step of each token [B, C] (recorded by the masked family's sampler)."""
    if inputs.step is None:
        raise ValueError("policy.estimator tracerl / agrpo replays the decoding steps, and these rows recorded none")
    return inputs.step


def collapse_steps(step: Tensor, shrink: int) -> Tensor:
    """Each row's steps [B, C] with its distinct values merged `shrink` at a time into the last of
    each group (TraceRL's `collapse_k_unique`)."""
    if shrink < 1:
        raise ValueError(f"policy.trace_shrink={shrink} must be >= 1")
    out = torch.empty_like(step)
    for i, row in enumerate(step):
        distinct = torch.unique(row)
        last = torch.clamp((torch.arange(len(distinct)) // shrink + 1) * shrink - 1, max=len(distinct) - 1)
        out[i] = distinct[last][torch.searchsorted(distinct, row)]
    return out


def step_views(step: Tensor, chosen: list[Tensor], keep: Tensor, temperature: float) -> list[View]:
    """View k masks the tokens of each row's step `chosen[k][i]` and later, and scores those of
    that step; a row with fewer steps (chosen value -1) gets an empty view."""
    views = []
    for values in chosen:
        at = values[:, None]
        live = at >= 0
        views.append(View(masked=(step >= at) & live, prompt_masked=keep, weight=torch.ones(len(step)),
                          scored=(step == at) & live, temperature=temperature))
    return views


def ranked(values: list[Tensor]) -> list[Tensor]:
    """Per row distinct values (each a 1-D tensor) as columns: column k holds each row's k-th (-1 past its end)."""
    most = max(len(v) for v in values)
    table = torch.full((len(values), most), -1, dtype=torch.long)
    for i, v in enumerate(values):
        table[i, :len(v)] = v
    return list(table.T)


@LOGP_ESTIMATORS.register("tracerl")
def tracerl(inputs: EstimatorInputs) -> list[View]:
    step, units = collapse_steps(decoding_steps(inputs), inputs.args.trace_shrink), inputs.units()
    # the steps that committed one of the row's units (TraceRL skips those of the padding after EOS)
    return step_views(step, ranked([torch.unique(row[u]) for row, u in zip(step, units)]), inputs.keep_prompt(), 1.0)


def agrpo_draws(inputs: EstimatorInputs) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Per row: the distinct steps drawn, how many times each was drawn, and its probability."""
    step, units = decoding_steps(inputs), inputs.units()
    samples, how = inputs.args.agrpo_samples, inputs.args.agrpo_step_sampling
    if samples < 1 or how not in AGRPO_STEP_SAMPLING:
        raise ValueError(f"policy.agrpo_samples={samples} must be >= 1 and policy.agrpo_step_sampling={how!r} one of "
                         f"{AGRPO_STEP_SAMPLING}")
    drawn, counts, probs = [], [], []
    for i, g in enumerate(inputs.generators):
        last = int(step[i][units[i]].max()) if units[i].any() else 0
        u = (torch.randperm(samples, generator=g) + torch.rand(samples, generator=g, dtype=torch.float64)) / samples
        if how == "uniform":
            p = torch.full((last + 1,), 1.0 / (last + 1), dtype=torch.float64)
            picks = torch.floor(u * (last + 1)).long().clamp(max=last)
        else:  # each step's committed tokens' summed entropy (AGRPO: + 1e-8, steps past the last: 0)
            weight = torch.full((last + 1,), 1e-8, dtype=torch.float64)
            inside = step[i] <= last
            weight.index_add_(0, step[i][inside], inputs.entropy[i][inside].double())
            p = weight / weight.sum()
            picks = torch.searchsorted(p.cumsum(0), u).clamp(max=last)
        values, times = torch.unique(picks, return_counts=True)
        drawn.append(values)
        counts.append(times)
        probs.append(p[values])
    return drawn, counts, probs


@LOGP_ESTIMATORS.register("agrpo")
def agrpo(inputs: EstimatorInputs) -> list[View]:
    drawn, _, _ = agrpo_draws(inputs)
    return step_views(decoding_steps(inputs), ranked(drawn), inputs.keep_prompt(), inputs.args.temperature)


def agrpo_unit_weights(inputs: EstimatorInputs) -> Tensor:
    """[B, C] fp32: each unit's Monte Carlo weight, (times its step was drawn) / (K p(step)); 0 for
    the units of steps not drawn. Its expectation is 1, so the weighted loss estimates the loss over
    every step of the trajectory (AGRPO's importance weights, times last + 1: AGRPO divides by
    the number of steps through its per-row normalisation, mmrl through its aggregation)."""
    step, samples = decoding_steps(inputs), inputs.args.agrpo_samples
    out = torch.zeros(step.shape, dtype=torch.float32)
    for i, (values, times, p) in enumerate(zip(*agrpo_draws(inputs))):
        for value, k, q in zip(values.tolist(), times.tolist(), p.tolist()):
            out[i][step[i] == value] = k / (samples * q)
    return out * inputs.units()
