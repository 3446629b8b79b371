"""The checks of the diffusion adapter's settings (`DiffusionConfig`), each naming the `policy.`
field: `branching_problems`, `pipeline_problems` and `check_settings` need no model (the engine runs
the first two with the whole recipe before anything loads, the second against the pipeline's
configs read without its weights: its sizes, its conditioning image, a sound's duration; the adapter runs the third
before it loads the pipeline), `fitted_family` checks the settings against the loaded pipeline's
family (its sizes, its kind of prediction, its guidance, its own needs: `Family.check_settings`)
and sets the family's flow shift and source area.
"""

from __future__ import annotations

from typing import Any

from ..model_loading import DTYPES
from .config import DiffusionConfig
from .family import Family, embedded_guidance_problem, family_of, image_column_problem
from .ltx2_guidance import settings_problem as guidance_settings_problem
from .pipeline_configs import PipelineConfigs, described_pipeline, loaded_configs
from .samplers import EPS_SAMPLERS, KL_FORMS, LOGPROB_FORMS, SAMPLERS, flow_grpo_kl_factor


def branching_problems(cfg: DiffusionConfig) -> list[str]:
    """What does not fit in the settings' BranchGRPO tree (`Policy.config_problems`)."""
    problems = cfg.branching.problems(cfg.num_steps)
    if cfg.branching.on and (cfg.turning_points or cfg.units != "steps"):
        problems.append("policy.branching: a tree of rollouts is trained by its steps; it does not go with "
                        "policy.turning_points or policy.units=forward_process")
    return problems


def pipeline_problems(cfg: DiffusionConfig) -> list[str]:
    """What in the settings the pipeline cannot take, from its configs (`pipeline_configs`); none
    where the pipeline cannot be described before it loads."""
    described = described_pipeline(cfg)
    family = described.family if described is not None else None
    return [] if family is None else family_problems(family, described, cfg)


def family_problems(family: type[Family], described: PipelineConfigs, cfg: DiffusionConfig) -> list[str]:
    """What in the settings the pipeline `described` (read before loading, or loaded) of `family`
    cannot take: its sizes, its conditioning image, its guidance, a sound's duration."""
    problems = [image_column_problem(family, cfg), embedded_guidance_problem(family, cfg),
                family.guidance_scale_2_problem(described.configs) if cfg.guidance_scale_2 is not None else None,
                family.duration_problem(described.configs, cfg.duration) if cfg.duration is not None else None,
                family.guidance_terms_problem(described.configs, cfg)]
    return size_problems(described, cfg) + [p for p in problems if p]


def size_problems(described: PipelineConfigs, cfg: DiffusionConfig) -> list[str]:
    """`policy.height` and `policy.width` against what the pipeline draws: multiples of its VAE's
    downsampling times its denoiser's patch size, up to its largest size."""
    family, name = described.family, described.classes[0]
    multiple, most = family.size_multiple(described.configs), family.max_size(described.configs)
    problems = []
    for key in ("height", "width"):
        value = getattr(cfg, key)
        if value < multiple or value % multiple:
            near = [v for v in (value // multiple * multiple, (value // multiple + 1) * multiple) if v > 0]
            problems.append(f"policy.{key}={value}: {name} draws heights and widths that are multiples of {multiple} "
                            f"(its VAE's downsampling times its denoiser's patch size); use "
                            f"{' or '.join(map(str, near))}")
        elif most is not None and value > most:
            problems.append(f"policy.{key}={value}: {name} draws at most {most} pixels a side (the positions its "
                            "denoiser learned)")
    return problems


def check_settings(cfg: DiffusionConfig) -> None:
    """Raise on the first setting that is wrong whatever the model (a name no registry knows, two
    settings that do not go together)."""
    if cfg.dtype not in DTYPES:
        raise ValueError(f"policy.dtype={cfg.dtype!r} is not one of {sorted(DTYPES)}")
    SAMPLERS.get(cfg.sampler)
    if cfg.kl_form not in KL_FORMS:
        raise ValueError(f"policy.kl_form={cfg.kl_form!r} is not one of {KL_FORMS}")
    if cfg.kl_form == "flow_grpo":
        flow_grpo_kl_factor(cfg.sampler, 1.0, 0.5)  # raises for a sampler Flow-GRPO has no KL for
    if cfg.kl_form == "velocity_mse" and (cfg.sampler in EPS_SAMPLERS or cfg.classifier_free_guidance):
        raise ValueError(f"policy.kl_form=velocity_mse is UniGRPO's regulariser of a flow model's unguided velocity: "
                         f"policy.sampler={cfg.sampler!r} and policy.classifier_free_guidance="
                         f"{str(cfg.classifier_free_guidance).lower()} (it needs a flow sampler and false)")
    if cfg.guidance_scale_2 is not None and not cfg.classifier_free_guidance:
        raise ValueError(f"policy.guidance_scale_2={cfg.guidance_scale_2} is a CFG scale (the low-noise expert's); "
                         "policy.classifier_free_guidance is false")
    if problem := guidance_settings_problem(cfg):
        raise ValueError(problem)
    if cfg.cps_logprob not in LOGPROB_FORMS:
        raise ValueError(f"policy.cps_logprob={cfg.cps_logprob!r} is not one of {sorted(LOGPROB_FORMS)}")
    if cfg.cps_logprob != "gaussian" and cfg.sampler != "cps":
        raise ValueError(f"policy.cps_logprob={cfg.cps_logprob!r} is the CPS sampler's; policy.sampler is {cfg.sampler!r}")
    if cfg.tp_consistent_steps not in ("all", "first"):
        raise ValueError(f"policy.tp_consistent_steps={cfg.tp_consistent_steps!r} is not one of ('all', 'first')")
    if cfg.units not in ("steps", "forward_process"):
        raise ValueError(f"policy.units={cfg.units!r} is not one of ('steps', 'forward_process')")
    if cfg.units == "forward_process" and cfg.classifier_free_guidance:
        raise ValueError("policy.units=forward_process trains the CFG-free model (DiffusionNFT): set "
                         "policy.classifier_free_guidance=false")
    if not 0 < cfg.forward_fraction <= 1 or int(cfg.num_steps * cfg.forward_fraction) < 1:
        raise ValueError(f"policy.forward_fraction={cfg.forward_fraction} must be in (0, 1] and keep at least "
                         f"one of the {cfg.num_steps} noise levels")
    problems = branching_problems(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    if cfg.num_steps < 2 or cfg.eval_num_steps < 1:
        raise ValueError(f"policy.num_steps={cfg.num_steps} must be >= 2 (the last step is never trained)")


def fitted_family(cfg: DiffusionConfig, pipe: Any) -> Family:
    """The family of the loaded `pipe`, checked against the settings, with `policy.flow_shift` set."""
    family = family_of(pipe, (cfg.height, cfg.width), cfg.num_frames)
    if problems := family_problems(type(family), loaded_configs(pipe), cfg):
        raise ValueError(problems[0])
    family.check_settings(cfg)
    if cfg.flow_shift is not None:
        family.set_flow_shift(cfg.flow_shift)
    if cfg.source_area is not None:
        family.set_source_area(cfg.source_area)
    if cfg.duration is not None:
        family.set_duration(cfg.duration)
    name = type(family).__name__
    if (cfg.sampler in EPS_SAMPLERS) != (family.kind == "eps"):
        raise ValueError(f"policy.sampler={cfg.sampler!r} does not fit a {name} "
                         f"model ({'ddim' if family.kind == 'eps' else 'flow_sde, dance, cps or ode'})")
    if cfg.turning_points and cfg.schedule.kind == "random_window":
        raise ValueError("policy.turning_points needs one window for the whole batch; policy.schedule.kind="
                         "random_window draws one per group (use window or sliding_window)")
    if cfg.units == "forward_process" and family.kind != "flow":
        raise ValueError(f"policy.units=forward_process re-noises samples on the flow-matching forward process; "
                         f"a {name} model predicts eps (use a flow model)")
    return family
