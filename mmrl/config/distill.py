"""The recipe's ``algorithm.distill:`` section: on-policy distillation from a frozen teacher
(docs/methods.md, 'On-policy distillation')."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class DistillConfig:
    """A teacher that scores the student's own rollouts, and how its per-unit divergence enters the
    advantage (mmrl/core/distillation.py)."""

    teacher: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "The teacher, built in process through the same adapter as the student: these keys replace the "
        "policy section's (e.g. {model: path/to/teacher}), and the teacher is frozen; or {url: http://HOST:PORT}, "
        "a teacher served by `mmrl serve-teacher` (divergence sampled). Empty: no distillation.")})
    teachers: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"help": (
        "Several teachers by name, each as `teacher` (keys replacing the policy section's), each row scored by "
        "the one its data column `teacher_column` names (multi-teacher on-policy distillation: a teacher per "
        "domain or data source, as Tinker's multi-teacher recipe routes each data set to its teacher). Give "
        "teacher or teachers, not both.")})
    teacher_column: str | None = field(default=None, metadata={"help": (
        "The data column naming each training row's teacher (a key of `teachers`); needed with several "
        "teachers, checked on the data before any model loads.")})
    weight: float = field(default=1.0, metadata={"stage": True, "help": (
        "w in A_iu = A_i - w d_iu: the weight of the per-unit divergence d of the student from the teacher.")})
    with_reward: bool = field(default=True, metadata={"help": (
        "Keep the group-relative reward advantage A_i and add the distillation signal to it; false: the "
        "signal alone is the advantage (pure on-policy distillation; the rewards are still scored and logged).")})
    divergence: Literal["sampled", "closed_form", "jsd"] = field(default="sampled", metadata={"help": (
        "The per-unit divergence d: sampled (log pi_student - log pi_teacher at the sampled unit, a one-sample "
        "reverse KL: any family with log-probs; Thinking Machines' OPD), closed_form (the adapter's exact "
        "per-unit KL(student || teacher), the teacher replaying the student's states: Gaussian denoising "
        "steps, verl-omni's diffusion OPD) or jsd (GKD's generalised JSD with beta over the vocabulary of a "
        "token adapter, TRL's convention).")})
    form: Literal["advantage", "loss"] = field(default="advantage", metadata={"help": (
        "How d enters: advantage (detached, A_iu = A_i - w d_iu: the reverse-KL policy gradient of on-policy "
        "distillation, any divergence) or loss (d differentiated through the student and w d added to every "
        "unit's loss beside the surrogate: verl-omni's diffusion distill_kl with closed_form, GKD's loss with "
        "jsd; not with sampled, whose one-sample estimate has no pathwise gradient).")})
    beta: float = field(default=0.5, metadata={"help": (
        "divergence jsd: GKD's interpolation, M = (1 - beta) student + beta teacher; 0 is the forward KL "
        "(teacher || student), 1 the reverse KL (student || teacher), as TRL's GKDConfig.beta.")})

    @property
    def active(self) -> bool:
        """Whether a teacher is named."""
        return bool(self.teacher or self.teachers)

    @property
    def named_teachers(self) -> dict[str, dict[str, Any]]:
        """Each teacher's keys by name: `teachers`, or the one `teacher` named "teacher"."""
        return dict(self.teachers) if self.teachers else ({"teacher": self.teacher} if self.teacher else {})
