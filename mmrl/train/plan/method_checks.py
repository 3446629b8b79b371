"""The method's settings checked together (`algorithm:` with what the adapter's units give): the
estimator and objective names, the objective's unit terms, GRPO-Guard's ratio normalisation,
FlowDPPO's trust region, the median estimator's odd groups, distribution matching's needs."""

from __future__ import annotations

from mmrl.config.sections import TrainConfig
from mmrl.core.estimators import ADVANTAGE_ESTIMATORS
from mmrl.core.objectives import AGGREGATIONS, OBJECTIVES
from mmrl.core.regularisers import CLOSED_FORM_KL, KL_ESTIMATORS
from mmrl.train.plan.registry_names import check_name


def check_algorithm(cfg: TrainConfig, problems: list[str]) -> None:
    algo = cfg.algorithm
    check_name(problems, ADVANTAGE_ESTIMATORS, "algorithm.estimator", algo.estimator)
    check_name(problems, OBJECTIVES, "algorithm.objective", algo.objective)
    check_name(problems, AGGREGATIONS, "algorithm.aggregation", algo.aggregation)
    check_name(problems, KL_ESTIMATORS, "algorithm.kl_estimator", algo.kl_estimator, [CLOSED_FORM_KL])
    if algo.kl_level == "sequence" and algo.kl_estimator == CLOSED_FORM_KL:
        problems.append("algorithm.kl_level='sequence' applies an estimator (k1, k2, k3) to the rows' summed "
                        "log-probs; kl_estimator closed_form is the adapter's per-unit KL")
    if algo.ratio_level == "chunk" and not algo.chunks:
        problems.append("algorithm.chunks: ratio_level='chunk' needs the chunk sizes (a list of unit counts)")
    if algo.estimator == "median" and algo.group_size % 2 == 0:  # mmrl/core/advantages.py's median_advantages
        problems.append(f"algorithm.group_size={algo.group_size}: the median estimator (MC-GRPO) draws G+1 "
                        f"rollouts, an odd number, so that the median is one of them; use {algo.group_size + 1}")
    if 2 * algo.train_extremes > algo.group_size:
        problems.append(f"algorithm.train_extremes={algo.train_extremes}: the k highest and k lowest rows of a "
                        f"group of algorithm.group_size={algo.group_size} overlap; use at most "
                        f"{algo.group_size // 2}")


def check_dppo(cfg: TrainConfig, adapter_problem: str | None, problems: list[str]) -> None:
    """FlowDPPO's mask: in place of the clip objective's per-unit ratio clip, over several update
    passes (with one the policy is the old one and nothing is ever masked), from the adapter's
    exact per-unit divergence."""
    algo = cfg.algorithm
    name = "algorithm.trust_region='dppo'"
    if adapter_problem:
        problems.append(f"{name}: {adapter_problem}")
    if algo.objective != "clip" or algo.ratio_level != "unit" or algo.ratio_norm != "none" or algo.dual_clip:
        problems.append(f"{name} replaces the clip of the clip objective's per-unit ratio (algorithm.objective: clip, "
                        f"ratio_level: unit, ratio_norm: none, dual_clip: null), not objective={algo.objective!r}, "
                        f"ratio_level={algo.ratio_level!r}, ratio_norm={algo.ratio_norm!r}, "
                        f"dual_clip={algo.dual_clip!r}")
    if algo.mu < 2:
        problems.append(f"{name} masks units that moved away from the old policy, which needs algorithm.mu >= 2 "
                        f"update passes (UniRL's FlowDPPO recipe: 2); with mu={algo.mu} nothing is ever masked")
    if not algo.dppo_threshold > 0:
        problems.append(f"algorithm.dppo_threshold={algo.dppo_threshold!r} must be > 0 (UniRL's default 1e-5)")


def check_ratio_norm(cfg: TrainConfig, adapter_problem: str | None, problems: list[str]) -> None:
    """GRPO-Guard's normalised ratio: the clip objective's unit ratios, one update pass (the old
    step mean is the current one, so its mean-shift term is 0), and the adapter's step scales."""
    algo = cfg.algorithm
    name = f"algorithm.ratio_norm={algo.ratio_norm!r}"
    if adapter_problem:
        problems.append(f"{name}: {adapter_problem}")
    if algo.objective != "clip" or algo.ratio_level != "unit":
        problems.append(f"{name} normalises the clip objective's per-step ratio (algorithm.objective: clip, "
                        f"ratio_level: unit), not objective={algo.objective!r}, ratio_level={algo.ratio_level!r}")
    if algo.mu != 1:
        problems.append(f"{name} needs algorithm.mu: 1 (mmrl keeps no old step means for GRPO-Guard's "
                        f"mean-shift term), not {algo.mu}")


def check_unit_terms(cfg: TrainConfig, given: str, problems: list[str]) -> None:
    """The objective takes what the adapter's units give (log-probs, DiffusionNFT's implicit
    velocity losses, or SPG's likelihood bounds), and such an objective is run as its authors run it."""
    algo = cfg.algorithm
    wanted = OBJECTIVES.get(algo.objective).unit_terms
    if wanted != given:
        problems.append(f"algorithm.objective={algo.objective!r} takes {wanted} from the policy, and the "
                        f"{cfg.task!r} adapter under this policy section gives {given} "
                        f"(DiffusionNFT: objective nft with task diffusion and policy.units: forward_process; SPG: "
                        f"objective spg with task dlm and policy.estimator: spg)")
    if wanted == "logprob_bounds":
        for name in ("beta", "entropy_coef", "llds_coef"):
            if getattr(algo, name):
                problems.append(f"algorithm.{name}={getattr(algo, name)}: objective {algo.objective!r} trains on "
                                "likelihood bounds, with no KL, entropy or LLDS term (SPG's); set it to 0")
        return
    if wanted != "implicit_velocity":
        return
    if algo.mu != 1:
        problems.append(f"algorithm.mu={algo.mu}: objective {algo.objective!r} takes the policy at the step's "
                        "start as its old policy, so it runs one update pass per batch (mu: 1)")
    if algo.beta > 0 and algo.kl_estimator != CLOSED_FORM_KL:
        problems.append(f"algorithm.kl_estimator={algo.kl_estimator!r}: objective {algo.objective!r} has no "
                        "log-probs; its KL is the velocity's to the reference (kl_estimator: closed_form)")
    for name in ("entropy_coef", "llds_coef"):
        if getattr(algo, name):
            problems.append(f"algorithm.{name}={getattr(algo, name)}: objective {algo.objective!r} has no "
                            "log-probs to regularise; set it to 0")


def check_distribution_matching(cfg: TrainConfig, adapter_problem: str | None, problems: list[str]) -> None:
    """DMD2 / DMDR: an adapter with score hooks, the clip objective (its loss takes the units' DMD
    losses beside the surrogate), one process, settings in range."""
    dm, name = cfg.algorithm.distribution_matching, "algorithm.distribution_matching.enabled=true"
    if adapter_problem:
        problems.append(f"{name}: {adapter_problem}")
    if cfg.algorithm.objective != "clip":
        problems.append(f"{name} adds the DMD loss to the clip objective's units; algorithm.objective="
                        f"{cfg.algorithm.objective!r} takes none")
    problems += dm.problems()
