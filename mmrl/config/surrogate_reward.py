"""The recipe's ``algorithm.distribution_matching.surrogate_reward:`` section: TDM-R1's learned surrogate
reward beside the distribution-matching student (docs/methods.md, 'TDM-R1: a surrogate reward for
few-step students'; mmrl/core/surrogate_reward.py). Defaults are the authors' (Flow-Factory's
TDM-R1 trainer)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class SurrogateRewardConfig:
    """A trainable copy of the real score fitted to the rewards by group preference, whose difference
    from the real score is the student's reward direction."""

    enabled: bool = field(default=False, metadata={"help": (
        "Train a surrogate reward (TDM-R1): a trainable copy of the real score fitted to the group-relative "
        "advantages by a group preference on its denoising errors, at each trained step's clean prediction; "
        "the student then follows the surrogate's clean prediction minus the real score's, beside the DMD "
        "loss. The reward reaches the student only through the surrogate (needs with_reward: false).")})
    lr: float = field(default=3e-4, metadata={"help": (
        "The surrogate's learning rate (AdamW, betas 0.9 / 0.999 and optim's weight decay; TDM-R1's default "
        "3e-4), its own optimizer, checkpointed with the run.")})
    beta: float = field(default=1.0, metadata={"help": (
        "beta of the group preference logit l_g = sum_{i in g} A_i beta (e_i - e_ref_i) / G (TDM-R1's "
        "surrogate_preference_beta).")})
    reference_beta: float = field(default=0.001, metadata={"help": (
        "Weight of the anchor mean (e - e_ref)^2 that keeps the surrogate's denoising errors near the real "
        "score's (surrogate_reference_beta).")})
    threshold: float = field(default=0.05, metadata={"help": (
        "Runaway stop: a row already moved in its advantage's direction by more than this in (e - e_ref)^2 "
        "gets no preference gradient (surrogate_reference_threshold).")})
    clip: float = field(default=1e-3, metadata={"help": (
        "Trust region against the slow copy: a row whose exp(e_slow - e) left 1 +- clip in its advantage's "
        "direction gets no preference gradient; 0 turns it off (surrogate_clip_range).")})
    slow_decay_min: float = field(default=0.001, metadata={"help": (
        "The slow copy follows the surrogate after each of its steps as slow = d slow + (1 - d) surrogate, "
        "d = min(slow_decay_max, slow_decay_min + 0.001 step): its lag grows with the run.")})
    slow_decay_max: float = field(default=0.3, metadata={"help": "The cap of the slow copy's decay d."})
    advantage_clip: float = field(default=5.0, metadata={"help": (
        "The advantages the surrogate learns from are clipped to [-advantage_clip, advantage_clip] "
        "(advantage_clip_range).")})
    tdm_weight: float = field(default=0.3, metadata={"help": (
        "The student's reward terms: tdm_weight x the guidance reward + (1 - tdm_weight) x the surrogate "
        "reward, in (0, 1); without guidance the first is absent.")})
    guidance_reward_scale: float = field(default=3.5, metadata={"help": (
        "s_r of the guidance reward s_r / (s - 1) (x0_guided - x0_cond) of the real score, s "
        "policy.guidance_scale; 0 (or no guidance) drops it (cfg_reward_scale).")})
    huber_c: float | None = field(default=None, metadata={"help": (
        "The student's reward terms in the pseudo-Huber metric sqrt(d^2 + c^2) - c with this c; null: "
        "0.5 d^2 (use_huber false, the authors' default).")})
    time_weighting: bool = field(default=True, metadata={"help": (
        "Weigh the surrogate's loss at trajectory step k (1..K) by (k + 1) / K, the later steps more "
        "(use_time_weighting).")})

    def problems(self, where: str = "algorithm.distribution_matching.surrogate_reward") -> list[str]:
        """What is wrong with the settings, each naming its field."""
        out = []
        for name in ("lr", "beta", "threshold", "advantage_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                out.append(f"{where}.{name}={value} must be a finite number > 0")
        for name in ("reference_beta", "clip", "guidance_reward_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                out.append(f"{where}.{name}={value} must be a finite number >= 0")
        if not 0.0 < self.tdm_weight < 1.0:
            out.append(f"{where}.tdm_weight={self.tdm_weight} must lie in (0, 1)")
        if not 0.0 <= self.slow_decay_min <= self.slow_decay_max <= 1.0:
            out.append(f"{where}.slow_decay_min={self.slow_decay_min}, slow_decay_max={self.slow_decay_max}: "
                       "need 0 <= min <= max <= 1")
        if self.huber_c is not None and not self.huber_c > 0:
            out.append(f"{where}.huber_c={self.huber_c} must be > 0 (or null)")
        return out
