"""The memory formula of a composite policy (the composite adapter's `memory_model`;
docs/memory-plan.md): its parts' own formulas (each part's adapter's `memory_model`), joined as the
composite runs them:

- the training state: both parts' modules under one `CompositeModel`, a frozen part
  (`policy.freeze`) taking no gradients or AdamW state, a part with its own LoRA
  (`policy.PART_lora`) training its adapters alone;
- the update: each trained part's units are their own slices, so a training pass runs one part at a
  time: the larger of the trained parts' passes (a part with LoRA trains no output layer);
- a rollout: the thinker writes `group_size` texts per prompt, then the generator draws one
  completion of each (its group size 1): the larger of the two calls. The generator's prompt is the
  composite's `prompt_template` with the thought (the thinker's `max_new_tokens`, counted as as many
  of the generator's tokens) and, where the template names it, the row's prompt; the template's own
  text is counted a token per character (the most); what the generator's own adapter adds to a
  prompt (Janus's template and begin-of-image token) is not counted.
"""

from __future__ import annotations

from typing import Any

from mmrl.config.parse import from_dict
from mmrl.core.lora import with_lora
from mmrl.core.memory_model import MemoryModel
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS

from .config import PARTS, CompositeConfig
from .model import CompositeModel


# the part tasks whose formulas were checked inside a composite against the probe (benchmarks.md)
CHECKED_PARTS = {"thinker": ("causal_lm",), "generator": ("janus",)}


def largest(passes: list[dict[str, int]]) -> dict[str, int]:
    """The pass of the most bytes (by component)."""
    return max(passes, key=lambda components: sum(components.values()), default={})


class CompositeMemory(MemoryModel):
    """The parts' formulas (`parts`: name -> the part adapter's `MemoryModel`), `trained` the parts
    that train and `head` those that train their output layer (no LoRA)."""

    def __init__(self, parts: dict[str, MemoryModel], trained: dict[str, bool], head: dict[str, bool]):
        super().__init__(CompositeModel({name: part.module for name, part in parts.items()}),
                         any(part.checkpointing for part in parts.values()))
        self.parts, self.trained, self.head = parts, trained, head
        self.family = f"composite: {parts['thinker'].family}, then {parts['generator'].family}"

    def _trained(self) -> list[tuple[str, MemoryModel]]:
        return [(name, part) for name, part in self.parts.items() if self.trained[name]]

    def activation_bytes(self, rows: int, checkpointing: bool) -> int:
        return max((part.activation_bytes(rows, checkpointing) for _, part in self._trained()), default=0)

    def update_bytes(self, rows: int, prompts: int, trains_head: bool) -> dict[str, int]:
        return largest([{f"{name}: {k}": v for k, v in part.update_bytes(rows, prompts, self.head[name]).items()}
                        for name, part in self._trained()])

    def first_step_bytes(self, rows: int, prompts: int) -> dict[str, int]:
        return largest([{f"{name}: {k}": v for k, v in part.first_step_bytes(rows, prompts).items()}
                        for name, part in self._trained()])

    def rollout_bytes(self, rows: int, group_size: int) -> dict[str, int]:
        calls = {"thinker": self.parts["thinker"].rollout_bytes(rows, group_size),
                 "generator": self.parts["generator"].rollout_bytes(rows, 1)}
        return largest([{f"{name}: {k}": v for k, v in call.items()} for name, call in calls.items()])


def generator_prompt_length(cfg: CompositeConfig, thinker: Any, prompt_length: int) -> int:
    """The generator's prompt in tokens, at most (module docstring)."""
    text = cfg.prompt_template.replace("{thought}", "").replace("{prompt}", "")
    row_prompt = prompt_length * cfg.prompt_template.count("{prompt}")
    return thinker.max_new_tokens * cfg.prompt_template.count("{thought}") + row_prompt + len(text)


def composite_memory(cfg: CompositeConfig, prompt_length: int) -> CompositeMemory:
    """Each part's formula from its own adapter (a part task not checked inside a composite is
    refused by name), the frozen part frozen and each part's LoRA applied as the policy applies them.
    One module serving both parts (`policy.shared_weights`) is refused: the formula holds two."""
    if cfg.shared_weights:
        raise UserError("mmrl plan: policy.shared_weights=true (one module thinks and draws) has no memory formula "
                        "(the composite's counts each part's module apart); its memory is not planned")
    settings = {name: from_dict(ADAPTERS.get(cfg.part_task(name)).Config, cfg.part_settings(name), f"policy.{name}")
                for name in PARTS}
    lengths = {"thinker": prompt_length,
               "generator": generator_prompt_length(cfg, settings["thinker"], prompt_length)}
    parts = {}
    for name in PARTS:
        if cfg.part_task(name) not in CHECKED_PARTS[name]:
            raise UserError(f"mmrl plan: a composite's {name} of task {cfg.part_task(name)} has no memory formula "
                            f"checked inside a composite (checked: {', '.join(CHECKED_PARTS[name])}); its memory "
                            "is not planned")
        part = ADAPTERS.get(cfg.part_task(name)).memory_model(settings[name], lengths[name])
        if cfg.freeze == name:
            part.module.requires_grad_(False)
        else:
            part.module = with_lora(part.module, cfg.part_lora(name))
        parts[name] = part
    return CompositeMemory(parts, {name: cfg.freeze != name for name in PARTS},
                           {name: not cfg.part_lora(name).r for name in PARTS})
