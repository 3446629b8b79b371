"""The composite adapter's settings (`policy:` with `task: composite`): the two parts' own policy
sections, the adapters that read them, and what differs per part in training (learning rate,
LoRA, frozen)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mmrl.config.sections import LoraConfig

PARTS = ("thinker", "generator")  # in the order of their units in a rollout


def _lora_help(part: str) -> str:
    return (f"LoRA on the {part}'s module alone (peft; r 0: the {part} trains whole). A composite takes its "
            "LoRA per part here: the recipe's optim.lora must stay off (r 0).")


@dataclass
class CompositeConfig:
    thinker_task: str = field(default="causal_lm", metadata={"help": (
        "The adapter of the thinker, the part that writes first: a registered adapter whose completions are text "
        "(causal_lm, vlm, audio_lm); its text is the prompt the generator draws from.")})
    thinker: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "The thinker's policy section, as `policy:` would be for thinker_task alone (model, max_new_tokens, "
        "temperature, ...); checked against that adapter's settings before anything loads.")})
    generator_task: str = field(default="diffusion", metadata={"help": (
        "The adapter of the generator, the part that draws from the thinker's text: a registered adapter whose "
        "completions are what the rewards score (diffusion: any image or video flow family).")})
    generator: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "The generator's policy section, as `policy:` would be for generator_task alone (model, num_steps, "
        "height, width, ...); checked against that adapter's settings before anything loads.")})
    freeze: Literal["none", "thinker", "generator"] = field(default="none", metadata={"help": (
        "A part that samples but does not train: its parameters are frozen and its units are not trained "
        "(unit mask 0). generator: the thinker learns to prompt a frozen generator (the prompt_enhancer reward's "
        "setting); thinker: the generator learns to draw a frozen thinker's prompts; none: both train.")})
    prompt_template: str = field(default="{thought}", metadata={"help": (
        "The generator's prompt made of the thinker's text: {thought} is the thinker's completion, {prompt} the "
        "row's prompt (e.g. '{prompt}. {thought}' keeps the request beside the rewrite).")})
    shared_weights: bool = field(default=False, metadata={"help": (
        "One unified model thinks and draws (T2I-R1's Janus-Pro: thinker_task janus_text, generator_task janus, "
        "the same model): the generator draws with the thinker's module, one set of weights trained by both kinds "
        "of unit, with one LoRA (thinker_lora) and one learning rate (thinker_lr); generator_lora, generator_lr "
        "and freeze stay unset. The checkpoint is the one model, as the thinker's adapter writes it.")})
    thinker_template: str = field(default="{prompt}", metadata={"help": (
        "The thinker's prompt made of the row's prompt, {prompt} replaced by it (e.g. T2I-R1's reasoning prompt "
        "in Janus-Pro's conversation format); the default hands the row's prompt as it is.")})
    thought_column: str = field(default="rewrite", metadata={"help": (
        "The data column of the text the thinker learns to write in the supervised warm start (warm_start.steps > "
        "0); the generator learns to draw warm_start.target_column from prompt_template of that text.")})
    thinker_lr: float | None = field(default=None, metadata={"help": (
        "The thinker's learning rate (null: optim.lr). The schedule scales it as it scales optim.lr, and a stage "
        "that changes optim.lr keeps its ratio to it.")})
    generator_lr: float | None = field(default=None, metadata={"help": (
        "The generator's learning rate (null: optim.lr); scheduled as thinker_lr is.")})
    thinker_clip: list[float] | None = field(default=None, metadata={"help": (
        "The thinker's tokens' clip range [eps_low, eps_high] of the clipped surrogate (null: algorithm.eps_low "
        "and eps_high), e.g. [0.2, 0.28] beside a generator's [1.0e-4, 1.0e-4].")})
    generator_clip: list[float] | None = field(default=None, metadata={"help": (
        "The generator's units' clip range [eps_low, eps_high] (null: algorithm.eps_low and eps_high).")})
    thinker_lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": _lora_help("thinker")})
    generator_lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": _lora_help("generator")})

    def part_settings(self, part: str) -> dict[str, Any]:
        """The policy section of `part` ('thinker' or 'generator')."""
        return self.thinker if part == "thinker" else self.generator

    def part_task(self, part: str) -> str:
        return self.thinker_task if part == "thinker" else self.generator_task

    def part_lr(self, part: str, lr: float) -> float:
        """The learning rate of `part` when optim.lr is `lr`."""
        own = self.thinker_lr if part == "thinker" else self.generator_lr
        return lr if own is None else own

    def part_clip(self, part: str) -> list[float] | None:
        return self.thinker_clip if part == "thinker" else self.generator_clip

    def part_lora(self, part: str) -> LoraConfig:
        return self.thinker_lora if part == "thinker" else self.generator_lora
