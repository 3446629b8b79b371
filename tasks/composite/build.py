"""The parts of a composite policy and the module that holds them, in its two forms:
- apart (`policy.shared_weights: false`): each part's adapter loads its own module, with its own LoRA
  (`policy.PART_lora`) or frozen;
- shared (`policy.shared_weights: true`): one unified model thinks and draws (Janus-Pro as T2I-R1
  trains it). The thinker's adapter loads the module; the generator's adapter is built on a module
  without weights (`model_loading.weightless`, no second load) and then handed the thinker's, after
  the parameters its adapter leaves untrained (frozen in its own build) are frozen in it too; one
  LoRA (`policy.thinker_lora`) covers both kinds of unit. The `CompositeModel` holds the module once,
  as `thinker`, and runs it for either part's name.
"""

from __future__ import annotations

from mmrl.config.parse import from_dict
from mmrl.core.lora import with_lora
from mmrl.core.policy import Policy
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS

from ..model_loading import weightless
from .config import PARTS, CompositeConfig
from .model import CompositeModel


def _part(cfg: CompositeConfig, name: str) -> Policy:
    adapter = ADAPTERS.get(cfg.part_task(name))
    return adapter(from_dict(adapter.Config, cfg.part_settings(name), f"policy.{name}"))


def build_parts(cfg: CompositeConfig) -> tuple[dict[str, Policy], CompositeModel]:
    """Each part's adapter by name and the module they train (module docstring)."""
    return _shared_parts(cfg) if cfg.shared_weights else _parts_apart(cfg)


def _parts_apart(cfg: CompositeConfig) -> tuple[dict[str, Policy], CompositeModel]:
    parts, modules = {}, {}
    for name in PARTS:
        part = _part(cfg, name)
        if cfg.freeze == name:
            part.model.requires_grad_(False)
        else:
            part.model = with_lora(part.model, cfg.part_lora(name))
        parts[name], modules[name] = part, part.model
    return parts, CompositeModel(modules)


def _shared_parts(cfg: CompositeConfig) -> tuple[dict[str, Policy], CompositeModel]:
    thinker = _part(cfg, "thinker")
    with weightless():
        generator = _part(cfg, "generator")
    own = generator.model
    if type(own) is not type(thinker.model):
        raise UserError(f"policy.shared_weights=true: the thinker ({cfg.thinker_task}, policy.thinker.model="
                        f"{cfg.thinker.get('model')!r}) loads a {type(thinker.model).__name__}, the generator "
                        f"({cfg.generator_task}) a {type(own).__name__}; one module must serve both")
    shared = dict(thinker.model.named_parameters())
    for name, param in own.named_parameters():
        if not param.requires_grad and name in shared:
            shared[name].requires_grad_(False)
    thinker.model = generator.model = with_lora(thinker.model, cfg.thinker_lora)
    return {"thinker": thinker, "generator": generator}, CompositeModel({"thinker": thinker.model},
                                                                         shared={"generator": "thinker"})


def thinker_prompts(cfg: CompositeConfig, prompts: list, prompt_column: str, prompt_of) -> list:
    """The rows as the thinker reads them: the prompt through `policy.thinker_template` (as they are
    under the default '{prompt}')."""
    if cfg.thinker_template == "{prompt}":
        return list(prompts)
    out = []
    for row in prompts:
        text = cfg.thinker_template.format(prompt=str(prompt_of(row)))
        out.append({**row, prompt_column: text} if isinstance(row, dict) else text)
    return out

