"""Distribution matching's two score models (`algorithm.distribution_matching`, DMD2 / DMDR): the
frozen real score (the teacher) and the fake score, a trainable copy of it with its own AdamW,
trained on the student's samples `fake_updates_per_step` times per student step (DMD2's two
timescales), checkpointed with the run (`fake_score.safetensors`, `fake_score_optimizer.pt`); with
`surrogate_reward` (TDM-R1) the pair also holds the surrogate reward model (surrogate_score.py),
trained after the fake score, whose reward terms join each unit's DMD loss; the re-noising levels are
uniform or DMDR's dynamic Beta at the pair's count of student steps; with DMDR's dynamic guidance the
student is judged by a third copy whose weights blend the real and the fake score's. Each
trained unit's DMD loss is computed here from the student's clean predictions under grad and the two
scores' predictions at the re-noised predictions (mmrl/core/distribution_matching.py); everything is
asked through the policy's score hooks (mmrl/core/score_hooks.py), so no family is named."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from torch import Tensor, nn

from mmrl.config.sections import TrainConfig
from mmrl.core.distribution_matching import (beta_levels, beta_schedule, blend_weights, dmd_gradient, dmd_loss,
                                             guidance_mix, noise_levels)
from mmrl.core.policy import Policy, build_policy
from mmrl.core.rollout import Rollout
from mmrl.core.seeding import derive_seed
from mmrl.errors import UserError
from mmrl.train.loop.surrogate_score import SurrogateScore
from mmrl.train.plan.teacher import policy_with_keys

FAKE_FILE, FAKE_OPTIMIZER_FILE = "fake_score.safetensors", "fake_score_optimizer.pt"
FIELD = "algorithm.distribution_matching"


class ScorePair:
    """The real and fake scores of one run, and the fake score's optimizer (module docstring)."""

    def __init__(self, cfg: TrainConfig, policy: Policy, real: nn.Module, process: int = 0):
        self.cfg, self.policy, self.process = cfg, policy, process
        self.real = real.eval().requires_grad_(False)
        self.fake = copy.deepcopy(real).train().requires_grad_(True)  # DMD2: the fake starts as the real score
        optim = cfg.optim
        self.optimizer = torch.optim.AdamW(self.fake.parameters(), lr=cfg.algorithm.distribution_matching.fake_lr,
                                           weight_decay=optim.weight_decay, betas=tuple(optim.betas))
        self.draws = 0  # the random draws taken so far (noise levels and noise), each from its own seed
        self.steps = 0  # the student steps taken so far (DMDR's dynamic renoise schedule)
        dm = cfg.algorithm.distribution_matching
        # DMDR's dynamic guidance: the real score the student meets, real + mix (fake - real), refreshed each step
        self.guide = copy.deepcopy(self.real) if dm.dynamic_guidance > 0 else None
        self.mix = 0.0
        self.surrogate = SurrogateScore(cfg, policy, self.real) if cfg.algorithm.distribution_matching.surrogate_reward.enabled else None

    def start_from(self, student: nn.Module) -> None:
        """After a warm start: the real and the fake score become copies of the student's weights now, when
        the real score is the student's own copy (`real` empty); the fake's optimizer starts afresh."""
        if self.cfg.algorithm.distribution_matching.real:
            return
        weights = student.state_dict()
        if weights.keys() != self.real.state_dict().keys():
            raise UserError(f"{FIELD}.real is empty (a copy of the student) and the student's weights after the warm "
                            "start are not the real score's (optim.lora?); name the real score's model in "
                            f"{FIELD}.real")
        for model in (self.real, self.fake):
            model.load_state_dict(weights)
        self.optimizer.state.clear()
        if self.surrogate is not None:
            self.surrogate.start_from(weights)

    def generator(self) -> torch.Generator:
        """A generator for the next draw, from (run seed, draw, process): the same on a resumed run."""
        self.draws += 1
        return torch.Generator().manual_seed(derive_seed(self.cfg.seed, self.draws, self.process, 0xD3D))

    def levels(self, n: int, low: float, high: float, gen: torch.Generator) -> Tensor:
        """n re-noising levels [n] in [low, high]: uniform, or DMDR's dynamic Beta at this student step."""
        dm = self.cfg.algorithm.distribution_matching
        if dm.level_sampling == "uniform":
            return noise_levels(n, low, high, gen)
        return beta_levels(n, low, high, beta_schedule(dm.level_alpha, dm.level_beta, self.steps, dm.level_decay_steps), gen)

    def unit_losses(self, model: nn.Module, mb: Rollout, units: slice) -> Tensor:
        """Each unit's DMD loss [b, u] under grad: the student's clean prediction re-noised at a level in
        [min_level, max_level], judged by the real (guided as configured) and the fake score; with the
        surrogate reward, plus the student's reward terms at the same re-noised prediction."""
        dm = self.cfg.algorithm.distribution_matching
        clean = self.policy.clean_predictions(model, mb, units)
        losses = []
        for j in range(clean.shape[1]):
            x, gen = clean[:, j], self.generator()
            levels = self.levels(len(x), dm.min_level, dm.max_level, gen)
            noise = torch.randn(x.shape, generator=gen)
            with torch.no_grad():
                real, _ = self.policy.denoised(self.judge(), mb, x.detach(), levels, noise, dm.real_guidance)
                fake, _ = self.policy.denoised(self.fake, mb, x.detach(), levels, noise, False)
            loss = dmd_loss(x, dmd_gradient(x, real, fake))
            if self.surrogate is not None:
                loss = loss + self.surrogate.reward_losses(mb, x, levels, noise, real, dm.real_guidance)
            losses.append(loss)
        return torch.stack(losses, 1)

    def judge(self) -> nn.Module:
        """The real score the student's DMD gradient asks: the teacher, or DMDR's blend while its mix is > 0."""
        return self.guide if self.guide is not None and self.mix > 0 else self.real

    def refresh_guidance(self) -> None:
        """DMDR's dynamic guidance at this student step: mix = dynamic_guidance c(step), and the blend's
        weights real + mix (fake - real) from the fake score as it is now (after its updates)."""
        dm = self.cfg.algorithm.distribution_matching
        self.mix = guidance_mix(dm.dynamic_guidance, self.steps, dm.dynamic_guidance_steps)
        if self.guide is not None and self.mix > 0:
            blend_weights(self.guide, self.real, self.fake, self.mix)

    def train_fake(self, rollout: Rollout, chunks: list[Tensor]) -> dict[str, float]:
        """`fake_updates_per_step` optimizer steps of the fake score's denoising loss on the student's
        samples (detached), over the step's micro-batches, noise levels uniform in [0, 1]; the mean loss."""
        dm, total, n = self.cfg.algorithm.distribution_matching, 0.0, max(sum(len(c) for c in chunks), 1)
        for _ in range(dm.fake_updates_per_step):
            self.optimizer.zero_grad(set_to_none=True)
            for rows in (c for c in chunks if len(c)):
                mb, gen = rollout.select(rows), self.generator()
                samples = self.policy.generated_samples(mb).detach()
                levels, noise = self.levels(len(mb), 0.0, 1.0, gen), torch.randn(samples.shape, generator=gen)
                _, loss = self.policy.denoised(self.fake, mb, samples, levels, noise, False)
                (loss.sum() / n).backward()
                total += float(loss.detach().sum()) / n
            self.optimizer.step()
        return {"dmd_fake_loss": total / max(dm.fake_updates_per_step, 1)}

    def prepared(self, batch, chunks: list[Tensor], student: nn.Module):
        """The step's batch after the fake score's updates (and the surrogate's, from the step's advantages,
        with `student`'s clean predictions), its advantages zeroed without the reward (DMD2)."""
        batch.metrics.update(self.train_fake(batch.rollout, chunks))
        if self.surrogate is not None:
            batch.metrics.update(self.surrogate.train(batch.rollout, chunks, batch.advantages, student, self.generator))
        self.refresh_guidance()
        if self.guide is not None:
            batch.metrics["dmd_guidance_mix"] = self.mix
        self.steps += 1
        if self.cfg.algorithm.distribution_matching.with_reward:
            return batch
        return replace(batch, advantages=torch.zeros_like(batch.advantages))

    def save(self, path: Path) -> None:
        save_model(self.fake, str(path / FAKE_FILE))
        torch.save({"optimizer": self.optimizer.state_dict(), "draws": self.draws, "steps": self.steps},
                   path / FAKE_OPTIMIZER_FILE)
        if self.surrogate is not None:
            self.surrogate.save(path)

    def load(self, path: Path) -> None:
        if not (path / FAKE_FILE).is_file():
            raise UserError(f"checkpoint {path} holds no fake score ({FAKE_FILE}) and this run trains one ({FIELD}.enabled); "
                            "resume with the settings it was saved with")
        load_model(self.fake, str(path / FAKE_FILE))
        state = torch.load(path / FAKE_OPTIMIZER_FILE, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.draws, self.steps = int(state["draws"]), int(state.get("steps", 0))
        if self.surrogate is not None:
            self.surrogate.load(path)


def real_score(cfg: TrainConfig, policy: Policy) -> nn.Module:
    """The frozen real score: the student's adapter built from the policy section with `real`'s keys, or a
    copy of the student as it starts when `real` is empty."""
    keys = cfg.algorithm.distribution_matching.real
    if not keys:
        return copy.deepcopy(policy.model)
    teacher = build_policy(cfg, policy_with_keys(cfg, keys, f"{FIELD}.real"))
    return teacher.model.to(next(policy.model.parameters()).device)


def build_scores(cfg: TrainConfig, policy: Policy, process: int) -> ScorePair | None:
    """The run's score pair when the recipe turns distribution matching on (in one process: the plan checks),
    else None."""
    if not cfg.algorithm.distribution_matching.enabled:
        return None
    return ScorePair(cfg, policy, real_score(cfg, policy), process)
