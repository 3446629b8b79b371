"""The recipe's ``algorithm:`` section: advantage estimation, the objective and its regularisers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mmrl.config.distill import DistillConfig
from mmrl.config.distribution_matching import DistributionMatchingConfig


@dataclass
class AlgorithmConfig:
    """Advantage estimation and the clipped surrogate (docs/methods.md, 'Advantage estimators' and
    'Objectives')."""

    group_size: int = field(default=8, metadata={"stage": True, "help": (
        "Rollouts per prompt (G), the group whose rewards give the baseline. The median estimator (MC-GRPO) needs "
        "an odd G+1; pairwise (2-GRPO) is meant for G = 2.")})
    estimator: str = field(default="grpo", metadata={"help": (
        "Advantage estimator: grpo (DeepSeekMath), dr_grpo (Dr. GRPO: no std), rloo (leave-one-out), median "
        "(MC-GRPO, odd groups), pairwise (2-GRPO), ngrpo (virtual max-reward sample), step (per-unit rewards, "
        "TP-GRPO). Formulas in docs/methods.md."), "choices": "mmrl.core.estimators:ADVANTAGE_ESTIMATORS"})
    std: Literal["group", "batch", "none"] = field(default="group", metadata={"stage": True, "help": (
        "Divide advantages by the std of the group, of the whole batch (Flow-GRPO's global std), or not at all. "
        "Ignored by dr_grpo and pairwise.")})
    eps: float = field(default=1e-4, metadata={"stage": True, "help": (
        "Added to the std before dividing (1e-4 as TRL; Flow-GRPO also 1e-4).")})
    std_ddof: Literal[0, 1] | None = field(default=None, metadata={"stage": True, "help": (
        "The std's delta degrees of freedom: 1 divides the squared deviations by n - 1 (the unbiased std: "
        "torch's default, TRL's and UniRL's), 0 by n (the population std: numpy's default, the stat tracker of "
        "Flow-GRPO and DiffusionNFT); null: the objective's authors' (0 for nft, 1 otherwise).")})
    clip_advantage: float | None = field(default=None, metadata={"stage": True, "help": (
        "Clamp advantages to [-c, c] (Flow-GRPO uses 5); null: no clip.")})
    batch_renorm: bool = field(default=False, metadata={"stage": True, "help": (
        "GDPO's second normalisation (Pref-GRPO's --apply_gdpo, on in all the authors' scripts): after the "
        "estimator (and reward_combine) give the advantages, standardise them over the whole batch, "
        "A <- (A - mean A) / (std A + eps), unbiased std over the rows that train, before clip_advantage.")})
    drop_zero_variance: bool = field(default=False, metadata={"stage": True, "help": (
        "Groups whose rewards are all equal take no part in the loss (DAPO's zero-variance filter); see "
        "sampling.dynamic to draw replacements.")})
    reward_combine: Literal["sum", "advantage", "gate", "product"] = field(default="sum", metadata={"stage": True,
        "help": "how the recipe's rewards make one: sum (weighted sum, then the estimator), advantage (the "
                "estimator on each reward, then the weighted sum of advantages: DanceGRPO, MixGRPO), gate "
                "(the non-gate rewards' weighted sum counts only where every reward in `gates` reaches its "
                "threshold, plus the gates' own weighted values: Vision-R1's hard formatting result reward) "
                "or product (prod_k w_k r_k); None rewards are left out of each"})
    gates: dict[str, float] = field(default_factory=dict, metadata={"stage": True,
        "help": "with reward_combine: gate, reward name -> threshold; e.g. {format: 1.0} pays the other "
                "rewards only where format >= 1 (Vision-R1). Give a gate weight 0 for a pure gate"})
    max_reward: float = field(default=1.0, metadata={"stage": True, "help": (
        "The reward of NGRPO's virtual sample that joins every group (estimator: ngrpo): the best reward a "
        "rollout can get.")})
    median_scale: Literal["mad", "std"] = field(default="mad", metadata={"help": (
        "normaliser of the median (MC-GRPO) estimator: mad = median absolute deviation of the group + 1e-3 "
        "(MC-GRPO's paper and code, lotusroot-kim/MC-GRPO); std = algorithm.std + algorithm.eps as the "
        "other estimators (mmrl's earlier rule)")})
    median_rescale: bool = field(default=False, metadata={"help": (
        "median (MC-GRPO) estimator: multiply a group's non-zero advantages by (G + 1) / (their number), "
        "as the authors' GSM8K trainer does (their MATH trainer and the paper do not)")})
    ratio_level: Literal["unit", "chunk", "sequence"] = field(default="unit", metadata={"help": (
        "Where the importance ratio is taken: unit (per token / denoising step: GRPO), chunk (one ratio per span "
        "of `chunks` units: Chunk-GRPO), sequence (one per rollout, exp of the mean log-ratio: GSPO).")})
    chunks: list[int] | None = field(default=None, metadata={"help": (
        "Sizes of consecutive unit spans sharing one ratio with ratio_level: chunk; they must sum to the number "
        "of units (Chunk-GRPO's best for 16 steps: [2, 3, 4, 7]).")})
    eps_low: float = field(default=0.2, metadata={"stage": True, "help": (
        "Lower clip range of the ratio, clip(rho, 1 - eps_low, 1 + eps_high) (GRPO 0.2; GSPO ~3e-4; diffusion "
        "~1e-4).")})
    eps_high: float = field(default=0.2, metadata={"stage": True, "help": (
        "Upper clip range of the ratio; above eps_low is DAPO's clip-higher (0.28).")})
    dual_clip: float | None = field(default=None, metadata={"stage": True, "help": (
        "Dual clip c > 1: the loss of a negative-advantage unit is bounded by -c A (Ye et al. 2020); null: off.")})
    beta: float = field(default=0.0, metadata={"stage": True, "help": (
        "Weight of the KL to the reference policy (DeepSeekMath 0.04; Flow-GRPO 0.01-0.04; many recipes 0). 0 "
        "runs no reference pass at all.")})
    kl_estimator: str = field(default="k3", metadata={"help": (
        "Per-unit KL estimate with x = log pi_ref - log pi_theta: k1 = -x, k2 = x^2/2, k3 = exp(x) - x - 1 "
        "(Schulman; GRPO's), or closed_form (the adapter's exact KL, e.g. Flow-GRPO's on a diffusion step's "
        "mean)."), "choices": "mmrl.core.regularisers:KL_ESTIMATORS,mmrl.core.regularisers:CLOSED_FORM_KL"})
    kl_level: Literal["unit", "sequence"] = field(default="unit", metadata={"help": (
        "Where kl_estimator applies: unit (to each unit's log-probs) or sequence (to each row's log-likelihood, the "
        "sum over its units, spread evenly over them: k(sum logp, sum ref) / units; ESPO's k2 on the sequence ELBO).")})
    aggregation: str = field(default="token_mean", metadata={"help": (
        "How unit losses are averaged over the batch: token_mean (1 / units in the batch: DAPO), "
        "seq_mean_token_mean (mean over a row's units, then rows: original GRPO), seq_mean_token_sum_norm (1 / "
        "(rows x max_units): Dr. GRPO)."), "choices": "mmrl.core.objectives:AGGREGATIONS"})
    max_units: int | None = field(default=None, metadata={"stage": True, "help": (
        "The constant of seq_mean_token_sum_norm (Dr. GRPO's max completion length); null: the adapter's bound "
        "(e.g. max_new_tokens), else the batch's longest rollout.")})
    entropy_coef: float = field(default=0.0, metadata={"stage": True, "help": (
        "Entropy bonus: -coef x H_u is added to each unit's loss (token families). 0: off.")})
    llds_coef: float = field(default=0.0, metadata={"help": (
        "Weight lambda of LLDS, the likelihood-preserving regulariser ('On GRPO Collapse in Search-R1'): "
        "penalises max(0, log pi_old - log pi_theta) on the units whose log-prob fell, in rollouts whose "
        "likelihood fell (which rows: llds_rows). 0: off.")})
    llds_rows: Literal["non_negative", "all"] = field(default="non_negative", metadata={"help": (
        "which rows LLDS preserves (algorithm.llds_coef > 0): non_negative = only rows (units) with "
        "advantage >= 0, as the LLDS authors' code and model card (Deng et al. 2025); all = every row "
        "whose likelihood fell, so a negative-advantage row is pushed back up (mmrl's earlier rule)")})
    prune_threshold: float = field(default=0.0, metadata={"stage": True, "help": (
        "Rows whose largest |advantage| is below this skip the update (CPPO-style pruning of low-advantage "
        "completions). 0: off.")})
    train_extremes: int = field(default=0, metadata={"stage": True, "help": (
        "DanceGRPO's best-of-N: of each group of group_size rollouts only the k with the highest and the k with "
        "the lowest advantage train (advantages still computed over the whole group; DanceGRPO's HunyuanVideo "
        "run: group_size 24, k 4). Ties: the earlier row counts as the lower. 0: every row trains.")})
    train_extremes_by: Literal["advantage", "reward"] = field(default="advantage", metadata={"stage": True,
        "help": "what algorithm.train_extremes ranks a group's rows by: advantage (DanceGRPO's code: the "
                "weighted sum of the rewards' advantages) or reward (the weighted total reward; differs from "
                "advantage only with reward_combine: advantage). A per-unit value is averaged over the units"})
    mu: int = field(default=1, metadata={"stage": True, "help": (
        "Update passes (optimizer steps) over each batch of rollouts (GRPO's mu; d1 uses 12). With mu > 1 the old "
        "log-probs are kept from before the first pass and the ratio departs from 1.")})
    objective: str = field(default="clip", metadata={"help": (
        "The surrogate loss: clip (PPO/GRPO clipped ratio), wd1 (ratio-free weighted likelihood, Tang et al. "
        "2025, softmax of advantages per group) or nft (DiffusionNFT: reward-weighted positive / negative "
        "denoising losses on the forward process; needs policy.units: forward_process)."),
        "choices": "mmrl.core.objectives:OBJECTIVES"})
    nft_beta: float = field(default=1.0, metadata={"stage": True, "help": (
        "objective nft: the implicit policies' step beta, v+ = beta v + (1 - beta) v_old, v- = (1 + beta) v_old - "
        "beta v; the loss is divided by it (DiffusionNFT's config.beta: 1.0, 0.1 for OCR).")})
    nft_adv_clip: float = field(default=5.0, metadata={"stage": True, "help": (
        "objective nft: advantages are clipped to [-c, c] and mapped to r = A / (2 c) + 1/2, and the loss is "
        "scaled by c (DiffusionNFT's adv_clip_max: 5).")})
    ratio_norm: Literal["none", "grpo_guard"] = field(default="none", metadata={"help": (
        "Per-step ratio normalisation of a diffusion step (clip objective, unit ratios): grpo_guard = GRPO-Guard's "
        "log-ratio times the step's std (its normalised ratio, one update pass) and each step's clipped loss "
        "divided by its |dt| (the gradient reweighting); needs the adapter's step scales (flow_sde or dance "
        "samplers). none: the plain ratio.")})
    trust_region: Literal["clip", "dppo"] = field(default="clip", metadata={"help": (
        "How the clip objective keeps a unit near the old policy: clip (PPO's ratio clip, eps_low / eps_high) or "
        "dppo (FlowDPPO, UniRL: no clip; the unit's loss -A rho is dropped where its exact divergence from the old "
        "policy, KL of the two step Gaussians, reaches algorithm.dppo_threshold and the ratio moves the way the "
        "advantage pushes it). dppo needs mu > 1 and an adapter with Gaussian steps (task diffusion, units: steps); "
        "the old step means are kept from before the first pass.")})
    dppo_threshold: float = field(default=1e-5, metadata={"stage": True, "help": (
        "trust_region dppo: the divergence at or above which a unit pushed further in its advantage's direction is "
        "dropped; the divergence is the mean over latent dims of (mu_theta - mu_old)^2 / (2 std^2) "
        "(UniRL's kl_mask_threshold, default 1e-5).")})
    rollout_correction: Literal["none", "tis", "mis"] = field(default="none", metadata={"help": (
        "Correct for the gap between the rollout sampler's log-probs (Rollout.rollout_logp) and the training "
        "forward's old log-probs, per unit, with rho = pi_old / pi_rollout (detached): tis = truncated IS, the "
        "unit's policy-gradient loss times min(rho, cap); mis = masked IS, times rho where rho <= cap and 0 above "
        "(TRL's token_truncate / token_mask, verl's token-level rollout_is). none: measured only "
        "(rollout/logp_diff_*). Needs an adapter that records rollout log-probs.")})
    rollout_correction_cap: float = field(default=2.0, metadata={"help": (
        "The cap C of rollout_correction: tis truncates rho at C, mis drops the units with rho > C (verl's "
        "rollout_is_threshold default 2; TRL's vllm_importance_sampling_clip_max default 3).")})
    distill: DistillConfig = field(default_factory=DistillConfig, metadata={"help": (
        "On-policy distillation: a frozen teacher scores the student's rollouts and its per-unit divergence "
        "is subtracted from the advantage (docs/methods.md, 'On-policy distillation').")})
    distribution_matching: DistributionMatchingConfig = field(default_factory=DistributionMatchingConfig, metadata={
        "help": ("Distribution matching for few-step students: DMD2 alone, or DMDR beside the reward objective "
                 "(docs/methods.md, 'Distribution matching').")})
