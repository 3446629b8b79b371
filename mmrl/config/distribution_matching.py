"""The recipe's ``algorithm.distribution_matching:`` section: DMD2's distribution matching for a
few-step student, alone or as the regulariser of the reward objective (DMDR) (docs/methods.md,
'Distribution matching')."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mmrl.config.surrogate_reward import SurrogateRewardConfig


@dataclass
class DistributionMatchingConfig:
    """A frozen real score and a fake score trained on the student's samples, whose difference at the
    re-noised samples is the student's gradient (mmrl/core/distribution_matching.py)."""

    enabled: bool = field(default=False, metadata={"help": (
        "Train the student by distribution matching (DMD2): a frozen real score (`real`) and a fake score (a "
        "trainable copy of the real one, trained on the student's own samples) judge each trained step's clean "
        "prediction, re-noised; their difference is the gradient of the student's DMD loss.")})
    real: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "The real score (the teacher), built through the same adapter: these keys replace the policy section's "
        "(e.g. {model: path/to/teacher}); empty: a frozen copy of the student as it starts (DMD2's setting, the "
        "student initialised from its teacher).")})
    weight: float = field(default=1.0, metadata={"stage": True, "help": (
        "The weight of each trained unit's DMD loss, added to the unit's loss beside the surrogate (DMDR's "
        "regulariser weight when with_reward is true).")})
    with_reward: bool = field(default=False, metadata={"help": (
        "Keep the group-relative reward advantage beside the DMD loss (DMDR: the reward objective regularised "
        "by DMD); false: the DMD loss alone trains the student (DMD2), the rewards scored and logged only.")})
    fake_lr: float = field(default=1e-4, metadata={"help": (
        "The fake score's learning rate (AdamW, with optim's betas and weight decay): its own optimizer, "
        "checkpointed with the run.")})
    fake_updates_per_step: int = field(default=1, metadata={"help": (
        "Fake-score optimizer steps per student step, each on the step's student samples with fresh noise "
        "(DMD2's two-timescale rule: the authors' dfake_gen_update_ratio, 5 for SDXL, 10 for ImageNet).")})
    min_level: float = field(default=0.02, metadata={"help": (
        "The lowest noise level (flow sigma in [0, 1]) at which a student sample is re-noised for the DMD "
        "gradient (DMD2's min_step_percent).")})
    max_level: float = field(default=0.98, metadata={"help": (
        "The highest noise level at which a student sample is re-noised (DMD2's max_step_percent).")})
    real_guidance: bool = field(default=True, metadata={"help": (
        "The real score predicts with the policy's classifier-free guidance (policy.guidance_scale, as the "
        "rollouts; DMD2's real_guidance_scale); false: unguided. The fake score is always unguided, as DMD2's.")})
    level_sampling: Literal["uniform", "beta"] = field(default="uniform", metadata={"help": (
        "How the re-noising levels are drawn, for the DMD gradient (in [min_level, max_level]) and the fake "
        "score's training (in [0, 1]): uniform (DMD2); beta: DMDR's dynamic renoise sampling, Beta(a, b) with "
        "a = 1 + (level_alpha - 1) c, b = 1 + (level_beta - 1) c, c = (1 + cos(pi min(step / level_decay_steps, "
        "1))) / 2, from Beta(level_alpha, level_beta) to uniform over the run's first level_decay_steps steps.")})
    level_alpha: float = field(default=4.0, metadata={"help": (
        "alpha of DMDR's dynamic Beta at the first step (level_sampling: beta; Flow-Factory's sample_continue "
        "default 4).")})
    level_beta: float = field(default=1.5, metadata={"help": (
        "beta of DMDR's dynamic Beta at the first step (Flow-Factory's sample_continue default 1.5).")})
    level_decay_steps: int = field(default=1000, metadata={"help": (
        "Student steps over which DMDR's dynamic Beta decays to uniform (Flow-Factory's dynamic_step, 1000); "
        "0 keeps Beta(level_alpha, level_beta).")})
    dynamic_guidance: float = field(default=0.0, metadata={"help": (
        "DMDR's dynamic distribution guidance: the real score that judges the student is asked with weights "
        "real + m (fake - real), m = dynamic_guidance c, c = (1 + cos(pi min(step / dynamic_guidance_steps, 1))) "
        "/ 2, so early on the real score leans towards the fake one and from dynamic_guidance_steps on it is "
        "the teacher; 0 (default): the teacher throughout. Flow-Factory's DMDR asks its fake score's LoRA at "
        "scale lora_scale_r c for the real score and at lora_scale_f for the fake: set lora_scale_r / "
        "lora_scale_f (0.25 in their examples). Costs one more copy of the score model's weights.")})
    dynamic_guidance_steps: int = field(default=1000, metadata={"help": (
        "Student steps over which dynamic_guidance decays to 0 (Flow-Factory's dynamic_step, the same cosine "
        "as level_decay_steps); must be > 0 when dynamic_guidance is.")})
    surrogate_reward: SurrogateRewardConfig = field(default_factory=SurrogateRewardConfig, metadata={"help": (
        "TDM-R1's learned surrogate reward for the student, beside the DMD loss (docs/methods.md, 'TDM-R1').")})

    def problems(self) -> list[str]:
        """What is wrong with the settings, each naming its field."""
        where = "algorithm.distribution_matching"
        out = []
        if not 0.0 <= self.min_level < self.max_level <= 1.0:
            out.append(f"{where}.min_level={self.min_level}, max_level={self.max_level}: need 0 <= min < max <= 1")
        if self.fake_updates_per_step < 0:
            out.append(f"{where}.fake_updates_per_step={self.fake_updates_per_step} must be >= 0")
        if self.fake_lr <= 0:
            out.append(f"{where}.fake_lr={self.fake_lr} must be > 0")
        if not (self.level_alpha > 0 and self.level_beta > 0):
            out.append(f"{where}.level_alpha={self.level_alpha}, level_beta={self.level_beta}: both must be > 0")
        if self.level_decay_steps < 0:
            out.append(f"{where}.level_decay_steps={self.level_decay_steps} must be >= 0")
        if self.dynamic_guidance < 0:
            out.append(f"{where}.dynamic_guidance={self.dynamic_guidance} must be >= 0")
        if self.dynamic_guidance > 0 and self.dynamic_guidance_steps <= 0:
            out.append(f"{where}.dynamic_guidance={self.dynamic_guidance} with dynamic_guidance_steps="
                       f"{self.dynamic_guidance_steps}: the guidance would never apply; need steps > 0")
        if self.dynamic_guidance > 0 and self.surrogate_reward.enabled:
            out.append(f"{where}.dynamic_guidance={self.dynamic_guidance} is DMDR's; TDM-R1's surrogate reward "
                       f"(surrogate_reward.enabled) judges against the teacher: set dynamic_guidance to 0")
        if self.surrogate_reward.enabled:
            out += self.surrogate_reward.problems()
            if self.with_reward:
                out.append(f"{where}.surrogate_reward.enabled=true: the reward reaches the student through the "
                           f"surrogate (TDM-R1); set {where}.with_reward=false")
        return out
