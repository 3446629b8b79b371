"""TDM-R1's surrogate reward model (`algorithm.distribution_matching.surrogate_reward`): a trainable copy
of the real score with its own AdamW and a slowly following copy for its trust region, fitted once per
step, after the fake score and before the student, to the step's group-relative advantages by the group
preference on its denoising errors at each trained step's clean prediction of the student (re-noised
on [min_level, max_level]); and the student's reward terms at a re-noised clean prediction (the
surrogate's clean prediction minus the real score's, and the real score's guidance). The maths is
mmrl/core/surrogate_reward.py; the models are asked through the policy's score hooks only, so no
family is named. Checkpointed with the run (`surrogate_score.safetensors`, `surrogate_score_state.pt`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_model, save_model
from torch import Tensor, nn

from mmrl.config.sections import TrainConfig
from mmrl.core.distribution_matching import noise_levels
from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout
from mmrl.core.surrogate_reward import (boundary_weight, guidance_direction, student_reward_loss,
                                        surrogate_coefficients)
from mmrl.errors import UserError

SURROGATE_FILE, SURROGATE_STATE_FILE = "surrogate_score.safetensors", "surrogate_score_state.pt"


class SurrogateScore:
    """The surrogate reward model, its slow copy and optimizer (module docstring)."""

    def __init__(self, cfg: TrainConfig, policy: Policy, real: nn.Module):
        self.cfg, self.policy, self.real = cfg, policy, real
        self.settings = cfg.algorithm.distribution_matching.surrogate_reward
        self.model = copy.deepcopy(real).train().requires_grad_(True)  # TDM-R1: the surrogate starts as the teacher
        self.slow = copy.deepcopy(real).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.settings.lr, betas=(0.9, 0.999),
                                           weight_decay=cfg.optim.weight_decay)
        self.updates = 0

    def start_from(self, weights: dict[str, Tensor]) -> None:
        """The surrogate and its slow copy become `weights` (the real score's after a warm start)."""
        for model in (self.model, self.slow):
            model.load_state_dict(weights)
        self.optimizer.state.clear()

    def _errors(self, model: nn.Module, rollout: Rollout, chunks: list[Tensor], clean: Tensor, levels: Tensor,
                noise: Tensor) -> Tensor:
        """`model`'s denoising errors [N] (no grad) of `clean` [N, ...] re-noised at `levels` with `noise`."""
        with torch.no_grad():
            return torch.cat([self.policy.denoised(model, rollout.select(rows), clean[rows], levels[rows],
                                                   noise[rows], False)[1].float().cpu() for rows in chunks])

    def _student_clean(self, student: nn.Module, rollout: Rollout, chunks: list[Tensor]) -> Tensor:
        """The student's clean prediction of every trained unit [N, U, ...] (fp32, no grad)."""
        units = slice(0, rollout.unit_mask.shape[1])
        with torch.no_grad():
            return torch.cat([self.policy.clean_predictions(student, rollout.select(rows), units).float().cpu()
                              for rows in chunks])

    def train(self, rollout: Rollout, chunks: list[Tensor], advantages: Tensor, student: nn.Module,
              generator: Callable[[], torch.Generator]) -> dict[str, float]:
        """One optimizer step of the surrogate on this step's rollouts, then the slow copy follows:
        at each trained unit k the loss w_k mean_i (c_i e_i + reference_beta (e_i - e_ref_i)^2) over the
        rows that train it (c from errors without grad, `surrogate_coefficients`), averaged over the
        units some row trains (w_k's K: all the units); `advantages` [N] or [N, U] the step's
        group-relative advantages. The mean loss."""
        s, dm = self.settings, self.cfg.algorithm.distribution_matching
        chunks = [c for c in chunks if len(c)]
        clean, units = self._student_clean(student, rollout, chunks), rollout.unit_mask.shape[1]
        _, group = torch.unique(rollout.group_id, return_inverse=True)
        self.optimizer.zero_grad(set_to_none=True)
        total, active = 0.0, [k for k in range(units) if bool((rollout.unit_mask[:, k] > 0).any())]
        for k in active:
            trained = rollout.unit_mask[:, k].float().cpu() > 0
            adv = (advantages[:, k] if advantages.dim() == 2 else advantages).float().cpu().clamp(
                -s.advantage_clip, s.advantage_clip) * trained
            gen = generator()
            levels = noise_levels(len(clean), dm.min_level, dm.max_level, gen)
            noise = torch.randn(clean[:, k].shape, generator=gen)
            args = (rollout, chunks, clean[:, k], levels, noise)
            e_ref, e_slow = self._errors(self.real, *args), self._errors(self.slow, *args)
            settings = {"beta": s.beta, "reference_beta": s.reference_beta, "threshold": s.threshold, "clip": s.clip}
            c = surrogate_coefficients(self._errors(self.model, *args), e_ref, e_slow, adv, group,
                                       self.cfg.algorithm.group_size, settings) * trained
            scale = (boundary_weight(k + 1, units) if s.time_weighting else 1.0) / (float(trained.sum()) * len(active))
            for rows in chunks:
                _, e = self.policy.denoised(self.model, rollout.select(rows), clean[rows, k], levels[rows],
                                            noise[rows], False)
                e = e.float()
                keep, coef, ref = (v[rows].float().to(e.device) for v in (trained, c, e_ref))
                loss = scale * (keep * (coef * e + s.reference_beta * (e - ref).pow(2))).sum()
                loss.backward()
                total += float(loss.detach())
        self.optimizer.step()
        self.follow_slow_copy()
        self.updates += 1
        return {"surrogate_loss": total}

    def follow_slow_copy(self) -> None:
        """slow = d slow + (1 - d) surrogate, d = min(slow_decay_max, slow_decay_min + 0.001 updates), updates
        the surrogate's steps before this one (the authors' trainer's step at its first update is 0)."""
        s = self.settings
        d = min(s.slow_decay_max, s.slow_decay_min + 0.001 * self.updates)
        with torch.no_grad():
            for slow, live in zip(self.slow.parameters(), self.model.parameters()):
                slow.mul_(d).add_(live.detach(), alpha=1.0 - d)

    def reward_losses(self, mb: Rollout, clean: Tensor, levels: Tensor, noise: Tensor, real_clean: Tensor,
                      real_guided: bool) -> Tensor:
        """The student's reward terms per row [b] under grad at its clean predictions `clean` [b, ...],
        re-noised as for the DMD term (`real_clean` the real score's prediction there, guided as
        `real_guided`): the surrogate's (guided likewise) direction, and the guidance reward when the
        real score is guided and the policy has guidance."""
        s = self.settings
        with torch.no_grad():
            surrogate, _ = self.policy.denoised(self.model, mb, clean.detach(), levels, noise, real_guided)
            guidance = None
            if real_guided and self.policy.guidance_scale() > 1.0 and s.guidance_reward_scale > 0:
                conditional, _ = self.policy.denoised(self.real, mb, clean.detach(), levels, noise, False)
                guidance = guidance_direction(real_clean, conditional, self.policy.guidance_scale(),
                                              s.guidance_reward_scale)
        return student_reward_loss(clean, surrogate.to(clean.device), real_clean.to(clean.device),
                                   None if guidance is None else guidance.to(clean.device), s.tdm_weight, s.huber_c)

    def save(self, path: Path) -> None:
        save_model(self.model, str(path / SURROGATE_FILE))
        torch.save({"optimizer": self.optimizer.state_dict(), "slow": self.slow.state_dict(),
                    "updates": self.updates}, path / SURROGATE_STATE_FILE)

    def load(self, path: Path) -> None:
        if not (path / SURROGATE_FILE).is_file():
            raise UserError(f"checkpoint {path} holds no surrogate reward model ({SURROGATE_FILE}) and this run "
                            "trains one (algorithm.distribution_matching.surrogate_reward.enabled); resume with the "
                            "settings it was saved with")
        load_model(self.model, str(path / SURROGATE_FILE))
        state = torch.load(path / SURROGATE_STATE_FILE, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.slow.load_state_dict(state["slow"])
        self.updates = int(state["updates"])
