"""DiffusionGemma's block diffusion sampler, seeded per group: the loop of transformers'
`DiffusionGemmaForBlockDiffusion.generate` (`generation_diffusion_gemma.py`, transformers 5.24),
step for step, with each group's noise drawn from its own generator.

The completion is written one canvas (block) of `config.canvas_length` tokens at a time. The
prompt and the finished canvases are encoded causally into a KV cache; a canvas starts as
uniformly random tokens (no mask token: uniform-state corruption) and, at each of up to
`denoising_steps` steps counting down from N to 1, the decoder reads the canvas, the cache and the
previous step's logits (self-conditioning; none at the first step) and

* divides the logits by the linear temperature T = t_min + (t_max - t_min) n / N (n: the steps
  left, so T falls from t_max to t_min + (t_max - t_min) / N);
* draws a denoised canvas from softmax(z / T) (`torch.multinomial`) and takes the argmax canvas;
* accepts the k lowest-entropy positions with sum_{i<k} H_i - max H <= `entropy_bound` (the
  entropy-bound sampler, arXiv 2505.24857) and replaces every other position by a fresh uniform
  token;
* stops a row once its argmax canvas is the same for `stability_threshold` steps and its mean
  entropy is below `confidence_threshold` (the row is then frozen).

The block's tokens are the last argmax canvas; a row whose block holds an EOS gets pad tokens after
it, and pads in every later block (as `generate`). The random draws of a group are those of
`generate` run on that group alone after `torch.manual_seed(seed)`: the first canvas
(`randint`), then per step the denoised canvas (`multinomial`) and the renoising canvas
(`randint`); a group whose rows have all stopped draws nothing more in the block, and a group
whose rows have all ended draws nothing in the later blocks (so a group's completions never depend
on the other groups of the batch). Positions are counted per row from its first real token
(`generate` counts them from the batch's first column; rotary attention sees only differences).

Greedy decoding takes the argmax for the denoised canvas (the temperature-0 limit of the draw);
the first and the renoising canvases are still drawn from the group's seed.

What the sampler records for the log-probs (`BlockDiffusionDraw`): per block, the canvas and the
self-conditioning signal the row's last step read (the decoder's `self_conditioning` input: the
softmax of the previous logits times the embedding matrix, [C, H]) and that step's temperature;
the log-prob of each completion token is log softmax(z / T) of that last step, the argmax token's.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor, nn


@dataclass
class BlockDiffusionConfig:
    """DiffusionGemma's generation settings; the defaults are transformers 5.24's
    `DiffusionGemmaGenerationConfig._get_default_generation_params`."""

    denoising_steps: int = field(default=48, metadata={"help": (
        "family diffusion_gemma: the most denoising steps per canvas (max_denoising_steps; transformers' default 48).")})
    entropy_bound: float = field(default=0.1, metadata={"help": (
        "family diffusion_gemma: the entropy-bound sampler's bound; a step accepts the lowest-entropy positions while "
        "their entropies minus the largest sum to at most this (transformers' default 0.1).")})
    t_min: float = field(default=0.4, metadata={"help": (
        "family diffusion_gemma: the temperature the linear schedule falls towards at the last step (default 0.4).")})
    t_max: float = field(default=0.8, metadata={"help": (
        "family diffusion_gemma: the temperature of the first denoising step (default 0.8).")})
    stability_threshold: int = field(default=1, metadata={"help": (
        "family diffusion_gemma: a row stops denoising its canvas once its argmax canvas has not changed for this "
        "many steps and it is confident (default 1; 0: confidence alone).")})
    confidence_threshold: float = field(default=0.005, metadata={"help": (
        "family diffusion_gemma: ... and the mean entropy of its tempered logits is below this (default 0.005).")})

    def check(self) -> None:
        if self.denoising_steps < 1:
            raise ValueError(f"policy.denoising_steps={self.denoising_steps} must be >= 1")
        if not self.entropy_bound > 0:
            raise ValueError(f"policy.entropy_bound={self.entropy_bound} must be > 0")
        if not 0 <= self.t_min < self.t_max:
            raise ValueError(f"policy.t_min={self.t_min} and policy.t_max={self.t_max}: need 0 <= t_min < t_max")
        if self.stability_threshold < 0 or not self.confidence_threshold > 0:
            raise ValueError(f"policy.stability_threshold={self.stability_threshold} must be >= 0 and "
                             f"policy.confidence_threshold={self.confidence_threshold} > 0")


@dataclass
class BlockDiffusionDraw:
    """What the sampler drew for B rows of `blocks` canvases of C tokens (H: the hidden size)."""

    completion_ids: Tensor     # [B, blocks * C] long: the blocks' argmax canvases, pad after a row's EOS
    logp: Tensor               # [B, blocks * C] fp32: log softmax(z / T) of each token at its block's last step
    canvas: Tensor             # [B, blocks, C] long: the canvas each block's last step read
    self_conditioning: Tensor  # [B, blocks, C, H] (model dtype): that step's self-conditioning signal
    temperature: Tensor        # [B, blocks] fp32: that step's temperature


def step_temperature(cfg: BlockDiffusionConfig, steps_left: int) -> float:
    """The linear schedule's temperature with `steps_left` steps to go (N at the first step)."""
    return cfg.t_min + (cfg.t_max - cfg.t_min) * (steps_left / cfg.denoising_steps)


def entropy_bound_accept(entropy: Tensor, bound: float) -> Tensor:
    """Bool [B, C]: the k lowest-entropy positions of each row with sum_{i<=k} H_(i) - H_(k) <= bound,
    from the positions' entropies [B, C]."""
    ordered, order = torch.sort(entropy, dim=-1)
    chosen = ordered.cumsum(-1) - ordered <= bound
    return torch.scatter(torch.zeros_like(chosen), -1, order, chosen)


class CanvasStopping:
    """Stable (the argmax canvas equal over `stability` steps) and confident (mean entropy of the
    tempered logits below `confidence`): `generate`'s StableAndConfidentStoppingCriteria."""

    def __init__(self, stability: int, confidence: float):
        self.stability, self.confidence = stability, confidence
        self.history: Tensor | None = None  # [stability, B, C], -1 before the first steps

    def __call__(self, argmax: Tensor, logits: Tensor) -> Tensor:
        if self.stability == 0:
            stable = torch.ones(argmax.shape[0], dtype=torch.bool, device=argmax.device)
        else:
            if self.history is None:
                self.history = torch.full((self.stability, *argmax.shape), -1, dtype=argmax.dtype, device=argmax.device)
            stable = (self.history == argmax[None]).all(-1).all(0)
            self.history = torch.cat([self.history[1:], argmax[None]])
        entropy = torch.distributions.Categorical(logits=logits).entropy()
        return stable & (entropy.mean(-1) < self.confidence)


def diffusion_gemma(model: nn.Module) -> nn.Module:
    """The `DiffusionGemmaForBlockDiffusion` inside `model` (a PEFT or process wrapper)."""
    found = next((m for m in model.modules() if type(m).__name__ == "DiffusionGemmaForBlockDiffusion"), None)
    if found is None:
        raise TypeError(f"{type(model).__name__} holds no DiffusionGemmaForBlockDiffusion")
    return found


def self_conditioning_module(model: nn.Module) -> nn.Module:
    """The decoder's self-conditioning block (its second input is the signal a step reads)."""
    return next(m for m in model.modules() if type(m).__name__ == "DiffusionGemmaSelfConditioning")


@contextmanager
def self_conditioning_signal(model: nn.Module, signal: Tensor | None = None,
                             seen: list[Tensor] | None = None) -> Iterator[None]:
    """Within the block: the decoder's self-conditioning signal replaced by `signal` [B, C, H]
    (a recorded one, replayed), and/or each forward's signal appended to `seen`."""
    def swap(module: nn.Module, args: tuple) -> tuple | None:
        if seen is not None:
            seen.append((signal if signal is not None else args[1]).detach())
        return (args[0], signal.to(args[1].dtype)) if signal is not None else None
    handle = self_conditioning_module(model).register_forward_pre_hook(swap)
    try:
        yield
    finally:
        handle.remove()


class PrefixCache:
    """The encoder's KV cache of each row's prompt and finished canvases, positions counted per row
    from its first real token. `inputs` are the prompt's extra encoder inputs (pixel_values,
    image_position_ids, mm_token_type_ids), read with the prompt only."""

    def __init__(self, model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, inputs: dict[str, Any]):
        from transformers import DynamicCache
        self.hf = diffusion_gemma(model)
        self.cache = DynamicCache(config=self.hf.config.get_text_config(decoder=True))
        self.attention = prompt_mask.bool()
        self.lengths = prompt_mask.long().sum(1)  # [B] real tokens so far
        self._encode(prompt_ids, (prompt_mask.long().cumsum(1) - 1).clamp(min=0), inputs)

    def _encode(self, ids: Tensor, positions: Tensor, inputs: dict[str, Any]) -> None:
        encoder = self.hf.model.encoder
        dummy = torch.empty(*ids.shape, 0, dtype=self.hf.dtype, device=ids.device)
        mapping = encoder.create_masks_for_generate(
            config=self.hf.config, inputs_embeds=dummy, attention_mask=self.attention, cache=self.cache,
            position_ids=positions, mm_token_type_ids=inputs.get("mm_token_type_ids"))
        encoder(input_ids=ids, attention_mask=mapping, cache=self.cache, position_ids=positions, **inputs)

    def append(self, canvas: Tensor) -> None:
        """Encode a finished canvas [B, C] after each row's tokens."""
        width = canvas.shape[1]
        self.attention = nn.functional.pad(self.attention, (0, width), value=True)
        self._encode(canvas, self.canvas_positions(width), {})
        self.lengths = self.lengths + width

    def canvas_positions(self, width: int) -> Tensor:
        """[B, width]: the positions of the next canvas."""
        return self.lengths[:, None] + torch.arange(width, device=self.lengths.device)

    def decoder_inputs(self, canvas: Tensor) -> dict[str, Any]:
        """The decoder's keyword inputs for `canvas` [B, C] after the cached tokens."""
        width = canvas.shape[1]
        attention = nn.functional.pad(self.attention, (0, width), value=True)
        mask = self.hf.model.decoder.create_diffusion_decoder_attention_mask(
            config=self.hf.config, inputs_embeds=canvas[..., None], cache=self.cache, decoder_attention_mask=attention)
        return {"cache": self.cache, "decoder_attention_mask": mask, "decoder_position_ids": self.canvas_positions(width)}


def group_generators(seeds: Sequence[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(int(s)) for s in seeds]
