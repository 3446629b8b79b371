"""DiffusionNFT's units (`policy.units: forward_process`): a clean sample re-noised on the forward
process (Zheng et al. 2025, 'DiffusionNFT: Online Diffusion Reinforcement with Forward Process';
docs/methods.md): their losses, and `ForwardProcessUnits`, the adapter's part that draws, records
and scores them.

A unit is a (clean sample x0, noise level t) pair: x_t = (1 - t) x0 + t eps with fresh noise eps,
the flow family's forward process. With v the policy's velocity at x_t and v_old the old policy's,

    v+ = beta v + (1 - beta) v_old          (the implicit positive policy)
    v- = (1 + beta) v_old - beta v          (the implicit negative policy)
    x0(u) = x_t - t u                       (the clean sample a velocity u points to)
    L(u) = mean_d (x0(u) - x0)^2 / sg(mean_d |x0(u) - x0|)   (the authors' adaptive weight, clipped at 1e-5)

and the unit's positive and negative losses are L(v+) and L(v-) (`implicit_velocity_losses`);
the objective `nft` (mmrl/core/objectives.py) weighs them by the normalised reward.

`ForwardProcessUnits` holds the units of `policy.units: forward_process`: which noise levels each
row trains (`forward_fraction` of them, drawn from the row's seed), the rollout's extras (`clean`
[N, ...] the final samples, `levels`, `timesteps`, `noise_seeds` [N], the conditioning; no
trajectory, no sampler log-probs), and under grad each unit's velocity on the rows that train it:
the losses above, the reference KL mean_d (v_theta - v_ref)^2, and as its log-prob surrogate
-mean_d (v_theta(x_t) - (eps - x0))^2.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout
from mmrl.core.seeding import derive_seed

from .config import DiffusionConfig
from .family import Cond, Family
from .noise import FORWARD_SALT, STEPS_SALT, generator
from .unit_rows import Reference, on_rows, rows_conditioning, unit_rows, untrained

ADAPTIVE_WEIGHT_MIN = 1e-5  # the authors' clip of the adaptive weight


def renoised(x0: Tensor, noise: Tensor, t: Tensor) -> Tensor:
    """x_t = (1 - t) x0 + t eps, `t` [B] broadcast over the sample's dimensions."""
    t = t.view(-1, *([1] * (x0.dim() - 1)))
    return (1 - t) * x0 + t * noise


def adaptive_denoising_loss(x0_pred: Tensor, x0: Tensor) -> Tensor:
    """mean_d (x0_pred - x0)^2 / sg(max(mean_d |x0_pred - x0|, 1e-5)) per row [B], in fp32."""
    diff = x0_pred.float() - x0.float()
    scale = diff.detach().abs().flatten(1).mean(1).clamp(min=ADAPTIVE_WEIGHT_MIN)
    return diff.pow(2).flatten(1).mean(1) / scale


def implicit_velocity_losses(v: Tensor, v_old: Tensor, xt: Tensor, x0: Tensor, t: Tensor,
                             beta: float) -> tuple[Tensor, Tensor]:
    """(L(v+), L(v-)) per row [B] for velocities at x_t (module docstring); `v_old` is detached."""
    v, v_old = v.float(), v_old.detach().float()
    t = t.float().view(-1, *([1] * (xt.dim() - 1)))
    positive = beta * v + (1 - beta) * v_old
    negative = (1 + beta) * v_old - beta * v
    return (adaptive_denoising_loss(xt.float() - t * positive, x0),
            adaptive_denoising_loss(xt.float() - t * negative, x0))


class ForwardProcessUnits:
    """DiffusionNFT's units of rollouts drawn by `family` under settings `cfg` (module docstring)."""

    def __init__(self, family: Family, cfg: DiffusionConfig):
        self.family, self.cfg = family, cfg

    def unit_mask(self, row_seeds: Sequence[int], steps: int) -> Tensor:
        """[N, U]: each row trains `forward_fraction` of the levels, drawn from its seed."""
        keep = int(steps * self.cfg.forward_fraction)
        units = torch.zeros(len(row_seeds), steps)
        for i, r in enumerate(row_seeds):
            units[i, torch.randperm(steps, generator=generator(derive_seed(r, STEPS_SALT)))[:keep]] = 1
        return units

    @staticmethod
    def extras(x: Tensor, levels: list[float], timesteps: Tensor, cond: Cond, row_seeds: Sequence[int]) -> dict[str, Any]:
        """The rollout's extras from its final samples `x` [N, ...] (module docstring)."""
        n = len(row_seeds)
        return {"clean": x.float().cpu(), "levels": torch.tensor(levels, dtype=torch.float64).expand(n, -1).clone(),
                "timesteps": timesteps.float().expand(n, -1).clone(),
                "noise_seeds": torch.tensor([derive_seed(r, FORWARD_SALT) for r in row_seeds]),
                **{k: v.cpu() for k, v in cond.items()}}

    def unit(self, model: nn.Module, batch: Rollout, k: int, rows: Tensor, device: torch.device):
        """Unit k of rows `rows`: (v_theta at x_t [r, ...], x_t, x0, eps, t) with x_t the final sample
        re-noised at level k by the noise of (row seed, k)."""
        ex = batch.extras
        x0 = ex["clean"][rows].to(device)
        eps = torch.stack([torch.randn(x0.shape[1:], generator=generator(derive_seed(int(s), k)))
                           for s in ex["noise_seeds"][rows]]).to(device)
        t = ex["levels"][rows, k].to(device=device, dtype=torch.float32)
        xt = renoised(x0, eps, t)
        v = self.family.predict(model, xt, ex["timesteps"][0, k], rows_conditioning(batch, rows, device, ("pos/",)),
                                1.0, False)
        return v, xt, x0, eps, t

    def logprobs(self, model: nn.Module, batch: Rollout, units: slice, device: torch.device, sharded: bool) -> Tensor:
        """[B, u]: the flow-matching surrogate of each unit's log-likelihood."""
        scores = []
        for k, rows in unit_rows(batch, units, sharded):
            if not len(rows):
                scores.append(untrained(device, len(batch)))
                continue
            v, _, x0, eps, _ = self.unit(model, batch, k, rows, device)
            scores.append(on_rows(-(v.float() - (eps - x0)).pow(2).flatten(1).mean(1), rows, len(batch)))
        return torch.stack(scores, 1)

    def losses(self, model: nn.Module, batch: Rollout, units: slice, beta: float, device: torch.device,
               sharded: bool, reference: Reference | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """(L+, L-) [B, u], the old velocity being `model`'s own, detached, and with `reference` the KL [B, u]."""
        positives, negatives, kls, n = [], [], [], len(batch)
        for k, rows in unit_rows(batch, units, sharded):
            if not len(rows):
                positives.append(untrained(device, n))
                negatives.append(untrained(device, n))
                if reference is not None:
                    kls.append(untrained(device, n))
                continue
            v, xt, x0, _, t = self.unit(model, batch, k, rows, device)
            pos, neg = implicit_velocity_losses(v, v.detach(), xt, x0, t, beta)
            positives.append(on_rows(pos, rows, n))
            negatives.append(on_rows(neg, rows, n))
            if reference is not None:
                with torch.no_grad(), reference() as ref:
                    v_ref = self.family.predict(ref, xt, batch.extras["timesteps"][0, k],
                                                rows_conditioning(batch, rows, device, ("pos/",)), 1.0, False)
                kls.append(on_rows((v.float() - v_ref.float()).pow(2).flatten(1).mean(1), rows, n))
        return torch.stack(positives, 1), torch.stack(negatives, 1), torch.stack(kls, 1) if kls else None
