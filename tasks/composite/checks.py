"""The composite adapter's checks that need no model: each part's settings typed and checked by its
own adapter (its problems named under ``policy.thinker.`` / ``policy.generator.``), what each part's
completions are, and what the composite's own fields ask of the parts."""

from __future__ import annotations

from mmrl.config.parse import ConfigError, from_dict
from mmrl.registry import ADAPTERS

from .config import PARTS, CompositeConfig


def composite_problems(cfg: CompositeConfig) -> list[str]:
    """Every problem of `cfg` known before loading, one message each naming the field."""
    problems = []
    if cfg.freeze not in ("none", *PARTS):
        problems.append(f"policy.freeze={cfg.freeze!r} is not one of none, thinker, generator")
    for name in PARTS:
        problems.extend(_part_problems(cfg, name))
    if cfg.freeze in PARTS and cfg.part_lora(cfg.freeze).r:
        problems.append(f"policy.{cfg.freeze}_lora.r={cfg.part_lora(cfg.freeze).r}: the {cfg.freeze} is frozen "
                        f"(policy.freeze={cfg.freeze}); set its LoRA rank to 0")
    for name in PARTS:
        lr = cfg.thinker_lr if name == "thinker" else cfg.generator_lr
        if lr is not None and lr < 0:
            problems.append(f"policy.{name}_lr={lr} must be >= 0 (null: optim.lr)")
    for name in PARTS:
        clip = cfg.part_clip(name)
        if clip is not None and (len(clip) != 2 or any(e < 0 for e in clip)):
            problems.append(f"policy.{name}_clip={clip} must be [eps_low, eps_high], both >= 0 (null: the "
                            "algorithm's)")
    problems.extend(_shared_problems(cfg))
    try:
        cfg.thinker_template.format(prompt="")
    except (KeyError, IndexError, ValueError) as err:
        problems.append(f"policy.thinker_template={cfg.thinker_template!r} names only {{prompt}} "
                        f"({type(err).__name__}: {err})")
    try:
        cfg.prompt_template.format(thought="", prompt="")
    except (KeyError, IndexError, ValueError) as err:
        problems.append(f"policy.prompt_template={cfg.prompt_template!r} names only {{thought}} and {{prompt}} "
                        f"({type(err).__name__}: {err})")
    return problems


def _shared_problems(cfg: CompositeConfig) -> list[str]:
    """What `policy.shared_weights` leaves to the thinker's settings: one LoRA, one learning rate,
    both parts trained."""
    if not cfg.shared_weights:
        return []
    problems = []
    if cfg.generator_lora.r:
        problems.append(f"policy.generator_lora.r={cfg.generator_lora.r}: with policy.shared_weights the one "
                        "module's LoRA is policy.thinker_lora; set the generator's rank to 0")
    if cfg.generator_lr is not None:
        problems.append(f"policy.generator_lr={cfg.generator_lr}: with policy.shared_weights the one module "
                        "trains at policy.thinker_lr (null: optim.lr); leave generator_lr null")
    if cfg.freeze != "none":
        problems.append(f"policy.freeze={cfg.freeze}: with policy.shared_weights both parts train the one "
                        "module; set freeze to none")
    return problems


def _part_problems(cfg: CompositeConfig, name: str) -> list[str]:
    """The problems of part `name`: its task, its settings under its own adapter, what it outputs."""
    task = cfg.part_task(name)
    if task == "composite" or task not in ADAPTERS:
        return [f"policy.{name}_task={task!r} is not an adapter a composite can hold (one of: "
                f"{', '.join(sorted(t for t in ADAPTERS if t != 'composite'))})"]
    adapter = ADAPTERS.get(task)
    try:
        own = from_dict(adapter.Config, cfg.part_settings(name), f"policy.{name}")
    except ConfigError as err:
        return [str(err)]
    problems = [p.replace("policy.", f"policy.{name}.") for p in adapter.config_problems(own)]
    if name == "thinker" and adapter.output_kind(own) != "text":
        problems.append(f"policy.thinker_task={task}: its completions are {adapter.output_kind(own)!r}, not the "
                        "text a generator is prompted with")
    if adapter.unit_terms(own) != "logprobs":
        problems.append(f"policy.{name}: its units give {adapter.unit_terms(own)!r}, not the log-probs a composite "
                        "trains with one objective")
    return problems
