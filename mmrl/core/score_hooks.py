"""The policy hooks of distribution matching (`algorithm.distribution_matching`, DMD2 / DMDR): a
policy whose samples can be re-noised and denoised (a diffusion or flow generator) gives its
trained units' clean predictions under grad, its rollouts' generated samples, and any score model's
clean prediction of a re-noised sample with that model's denoising loss. The engine asks these of
the student (under grad), of the frozen real score and of the trained fake score alike, through
the same adapter, so it names no family; `Policy` inherits them."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from mmrl.core.rollout import Rollout


class ScoreHooks:
    """Distribution matching's hooks, refused by default (module docstring)."""

    @classmethod
    def score_problem(cls, cfg: Any) -> str | None:
        """Why this adapter's policy (settings `cfg`) has no score model of its samples, or None."""
        return f"the {cls.__name__} adapter has no score model of its samples (Policy.denoised)"

    def clean_predictions(self, model: nn.Module, batch: Rollout, units: slice) -> Tensor:
        """Under grad: each unit's prediction of the clean sample by `model` [B, u, ...] (fp32; a
        denoising step's x0 from its own state), 0 where the row does not train the unit."""
        raise NotImplementedError(self.score_problem(getattr(self, "cfg", None)))

    def generated_samples(self, batch: Rollout) -> Tensor:
        """The rollouts' final samples [B, ...] (fp32, the space the score models denoise)."""
        raise NotImplementedError(self.score_problem(getattr(self, "cfg", None)))

    def denoised(self, model: nn.Module, batch: Rollout, clean: Tensor, levels: Tensor, noise: Tensor,
                 guided: bool) -> tuple[Tensor, Tensor]:
        """Score model `model` on the samples `clean` [B, ...] re-noised at `levels` [B] with `noise`
        [B, ...], conditioned on `batch`'s rows: (its clean prediction [B, ...] fp32, its denoising
        training loss per row [B]); `guided`: with the policy's classifier-free guidance."""
        raise NotImplementedError(self.score_problem(getattr(self, "cfg", None)))

    def guidance_scale(self) -> float:
        """The classifier-free guidance scale `denoised` applies when `guided` (1.0: the policy has none)."""
        return 1.0
