"""A flow generator's score-model terms for distribution matching (`algorithm.distribution_matching`,
DMD2 / DMDR; `Policy.clean_predictions`, `generated_samples`, `denoised`): the clean prediction of a
denoising step from the rollout's own state, x0 = x_s - s v(x_s) (each step forwarded on the rows
that train it, `unit_rows.py`), and a score model's clean prediction of a sample re-noised on the
rectified-flow path, x_s = (1 - s) x + s eps, with its flow-matching loss mean_d (v - (eps - x))^2
(the fake score's training loss, the warm start's `Family.noised` convention). Flow families only:
an eps-predicting family is refused by name. `DiffusionScoreHooks` gives the diffusion policy these
terms as the engine's score hooks.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout

from .config import DiffusionConfig
from .family import Family
from .unit_rows import on_rows, rows_conditioning, unit_rows, untrained


class ScoreUnits:
    """The score-model terms of rollouts drawn by `family` under settings `cfg` (module docstring)."""

    def __init__(self, family: Family, cfg: DiffusionConfig):
        self.family, self.cfg = family, cfg

    def check(self) -> None:
        """Refuse a family that is not a flow (its levels are not flow sigmas)."""
        if self.family.kind != "flow":
            raise ValueError(f"algorithm.distribution_matching: the {type(self.family).__name__} family predicts "
                             f"noise (kind {self.family.kind!r}); distribution matching takes flow families only")

    def clean_predictions(self, model: nn.Module, batch: Rollout, units: slice, device: torch.device,
                          sharded: bool) -> Tensor:
        """[B, u, ...] fp32: each trained step's x0 = x_s - s v(x_s) under `model`, 0 on other rows."""
        self.check()
        ex, cfg, n, out = batch.extras, self.cfg, len(batch), []
        for k, rows in unit_rows(batch, units, sharded):
            if not len(rows):
                out.append(untrained(device, n, *ex["latents"].shape[2:]))
                continue
            x = ex["latents"][rows, k].to(device).float()
            cond = rows_conditioning(batch, rows, device)
            v = self.family.predict(model, x, ex["timesteps"][0, k], cond, cfg.guidance_scale,
                                    cfg.classifier_free_guidance).float()
            out.append(on_rows(x - float(ex["levels"][0, k]) * v, rows, n))
        return torch.stack(out, 1)

    @staticmethod
    def generated_samples(batch: Rollout) -> Tensor:
        """The final latents of the rollouts [B, ...] fp32."""
        return batch.extras["latents"][:, -1].float()

    def denoised(self, model: nn.Module, batch: Rollout, clean: Tensor, levels: Tensor, noise: Tensor,
                 guided: bool, device: torch.device) -> tuple[Tensor, Tensor]:
        """(x0 prediction [B, ...], flow-matching loss [B]) of `model` at (1 - s) clean + s noise."""
        self.check()
        shape = (-1,) + (1,) * (clean.dim() - 1)
        s = levels.to(device).float()
        x0, eps = clean.to(device).float(), noise.to(device).float()
        x = (1 - s.view(shape)) * x0 + s.view(shape) * eps
        cond = rows_conditioning(batch, torch.arange(len(batch)), device)
        t = s * self.family.pipe.scheduler.config.num_train_timesteps
        cfg_on = guided and self.cfg.classifier_free_guidance
        if cfg_on:  # the families double the rows for guidance with one timestep for all: one row at a time
            v = torch.cat([self.family.predict(model, x[i:i + 1], t[i:i + 1], {k: c[i:i + 1] for k, c in cond.items()},
                                               self.cfg.guidance_scale, True).float() for i in range(len(x))])
        else:
            v = self.family.predict(model, x, t, cond, self.cfg.guidance_scale, False).float()
        return x - s.view(shape) * v, (v - (eps - x0)).pow(2).flatten(1).mean(1)


class DiffusionScoreHooks:
    """The diffusion policy's score hooks for distribution matching (`mmrl/core/score_hooks.py`), a
    mixin before `Policy`: each runs its `ScoreUnits` (`self.scores`) on the policy's device."""

    @classmethod
    def score_problem(cls, cfg: DiffusionConfig) -> str | None:
        return None if cfg.units == "steps" else f"policy.units={cfg.units!r} (distribution matching needs steps)"

    def clean_predictions(self, model: nn.Module, batch: Rollout, units: slice) -> Tensor:
        return self.scores.clean_predictions(model, batch, units, self.device, self.parallel.is_sharded(model))

    def generated_samples(self, batch: Rollout) -> Tensor:
        return self.scores.generated_samples(batch)

    def denoised(self, model: nn.Module, batch: Rollout, clean: Tensor, levels: Tensor, noise: Tensor,
                 guided: bool) -> tuple[Tensor, Tensor]:
        return self.scores.denoised(model, batch, clean, levels, noise, guided, self.device)

    def guidance_scale(self) -> float:
        return self.cfg.guidance_scale if self.cfg.classifier_free_guidance else 1.0
