"""SPG's and ESPO's log-likelihood estimators of a masked diffusion LM's completion (views, in
`estimators.py`'s sense; the formulas and the authors' code they follow: docs/dlm.md).

* ``spg`` (SPG, Wang et al. 2025, facebookresearch/SPG `forward_process`, `forward_type:
  block_random`): `spg_views` views; view v picks a block b_v (a random order of the completion's
  blocks of `block_length`, the first `spg_views` of them, taken modulo the blocks the row's units
  reach), masks a uniformly random number in [1, m] of the first m = min(block_length, L - b_v
  block_length) positions of that block, every later block and every column past the row's units
  (L of them). The lower bound (`weight`) is SPG's ELBO term: logp_u = L / (V n_v) for each view v
  that scores u (n_v: the row's units it masks), so sum_u logp_u = L mean_v mean_{u in S_v} log p.
  `sandwich_bounds` gives SPG's upper bound (EUBO) from the same views.
* ``espo`` (ESPO, Ou et al. 2025, ML-GSAI/ESPO `_get_elbo` with `reduce_var`): `espo_samples`
  pairs of complementary views; sample m masks x_m of the C completion columns, chosen uniformly,
  x_m = round(k + m (C + 1) / M) mod (C + 1) with k uniform in {0, ..., C} (ESPO spreads one k over
  the rows of a batch; mmrl over a row's M samples, as a row's views must not depend on its
  micro-batch); t = x_m / (C + 1); the view weighs 1 / (2 M t), its complement 1 / (2 M (C / (C + 1)
  - t)): sum_u logp_u is ESPO's ELBO estimate. Pair it with `algorithm.ratio_level: sequence`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .estimators import LOGP_ESTIMATORS, EstimatorInputs, View

SPG_NEGATIVE = ("eubo", "mix", "elbo")


def spg_masks(inputs: EstimatorInputs) -> list[Tensor]:
    """SPG's block_random masks [B, C] per view (min_t 0, max_t 1, the released scripts')."""
    width, block = inputs.width, inputs.args.block_length
    blocks, views = width // block, inputs.args.spg_views
    if views > blocks:
        raise ValueError(f"policy.spg_views={views} must be at most the completion's {blocks} blocks "
                         f"(gen_length / block_length), as SPG's")
    masks = [torch.zeros(inputs.rows, width, dtype=torch.bool) for _ in range(views)]
    columns = torch.arange(width)
    for i, (g, length) in enumerate(zip(inputs.generators, inputs.lengths.tolist())):
        length = max(int(length), 1)
        reached = (length - 1) // block + 1
        order = torch.randperm(blocks, generator=g) % reached
        for v in range(views):
            b = int(order[v])
            in_block = min(block, length - block * b)
            count = int(torch.randint(1, in_block + 1, (), generator=g))
            chosen = torch.randperm(in_block, generator=g)[:count] + block * b
            mask = (columns >= block * (b + 1)) | (columns >= length)
            mask[chosen] = True
            masks[v][i] = mask
    return masks


@LOGP_ESTIMATORS.register("spg")
def spg(inputs: EstimatorInputs) -> list[View]:
    keep, units, lengths = inputs.keep_prompt(), inputs.units(), inputs.lengths.float()
    views = []
    for mask in spg_masks(inputs):
        scored = (mask & units).sum(1).float().clamp(min=1e-8)
        views.append(View(mask, keep, lengths / (inputs.args.spg_views * scored)))
    return views


def sandwich_bounds(logps: Tensor, scored: Tensor, lengths: Tensor, beta: float, negative: str,
                    mix_weight: float) -> tuple[Tensor, Tensor]:
    """SPG's (lower, upper) per-unit terms [B, U] from V views' log-probs `logps` [V, B, U] at the
    units each scores (`scored` [V, B, U] bool, within the row's units), `lengths` [B] units per row.
    lower_u = L sum_v 1[u in S_v] logp_v / (V n_v); upper: ``eubo`` L 1[u in M] log a_u / (beta |M|)
    with a_u = mean_v 1[u in S_v] p_v^beta / t_v, t_v = n_v / L, M the units with a_u > 0 (SPG's
    `per_seq_logps_negative`); ``mix`` mix_weight eubo + (1 - mix_weight) lower; ``elbo`` lower."""
    views = logps.shape[0]
    count = scored.sum(-1).float()                                  # [V, B]
    length = lengths.float()[None, :, None]
    lower = (torch.where(scored, logps, 0.0) / count.clamp(min=1e-8)[..., None]).sum(0) * length[0] / views
    if negative == "elbo":
        return lower, lower
    t = (count / lengths.float()[None]).clamp(min=1e-8)[..., None]  # [V, B, 1]
    terms = torch.where(scored, beta * logps - torch.log(t), -math.inf)
    log_mean = torch.logsumexp(terms, 0) - math.log(views)          # [B, U]
    kept = scored.any(0)
    eubo = torch.where(kept, log_mean, 0.0) * length[0] / (beta * kept.sum(-1, keepdim=True).clamp(min=1))
    if negative == "eubo":
        return lower, eubo
    return lower, mix_weight * eubo + (1 - mix_weight) * lower


@LOGP_ESTIMATORS.register("espo")
def espo(inputs: EstimatorInputs) -> list[View]:
    width, samples, keep = inputs.width, inputs.args.espo_samples, inputs.keep_prompt()
    if samples < 1:
        raise ValueError(f"policy.espo_samples={samples} must be >= 1")
    counts = torch.zeros(inputs.rows, samples, dtype=torch.long)
    masks = torch.zeros(samples, inputs.rows, width, dtype=torch.bool)
    for i, g in enumerate(inputs.generators):
        start = int(torch.randint(0, width + 1, (), generator=g))
        for m in range(samples):
            counts[i, m] = round(start + m * (width + 1) / samples) % (width + 1)
            masks[m, i, torch.randperm(width, generator=g)[:counts[i, m]]] = True
    views = []
    for m in range(samples):
        t = counts[:, m].double() / (width + 1)
        rest = width / (width + 1) - t
        views.append(View(masks[m], keep, torch.where(t > 0, 1 / (2 * samples * t.clamp(min=1e-12)), 0.0).float()))
        views.append(View(~masks[m], keep, torch.where(rest > 1e-12, 1 / (2 * samples * rest.clamp(min=1e-12)),
                                                        0.0).float()))
    return views
