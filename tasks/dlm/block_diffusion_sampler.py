"""The block diffusion sampling loop (DiffusionGemma), each group's noise from its own generator;
the steps and what is recorded are described in `block_diffusion.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from .block_diffusion import (
    BlockDiffusionConfig,
    BlockDiffusionDraw,
    CanvasStopping,
    PrefixCache,
    diffusion_gemma,
    entropy_bound_accept,
    self_conditioning_signal,
    step_temperature,
)


@dataclass
class GroupNoise:
    """Each group's generator (on the model's device, as `generate`'s global one) and size."""

    generators: list[torch.Generator]
    group_size: int
    vocab: int

    def uniform(self, drawing: Tensor, width: int) -> Tensor:
        """Uniform tokens [B, width]; the groups not `drawing` ([groups] bool) draw nothing (0s)."""
        parts = [torch.randint(0, self.vocab, (self.group_size, width), generator=g, device=g.device) if on
                 else torch.zeros(self.group_size, width, dtype=torch.long, device=g.device)
                 for g, on in zip(self.generators, drawing.tolist())]
        return torch.cat(parts)

    def categorical(self, probs: Tensor, drawing: Tensor) -> Tensor:
        """One token per position [B, C] from `probs` [B, C, V]; non-drawing groups get 0s."""
        rows, width, vocab = probs.shape
        parts = []
        for k, (g, on) in enumerate(zip(self.generators, drawing.tolist())):
            block = probs[k * self.group_size:(k + 1) * self.group_size]
            parts.append(torch.multinomial(block.reshape(-1, vocab), 1, generator=g).view(-1, width) if on
                         else torch.zeros(self.group_size, width, dtype=torch.long, device=probs.device))
        return torch.cat(parts)

    def groups_with(self, rows: Tensor) -> Tensor:
        """[groups] bool: the groups with at least one of `rows` ([B] bool)."""
        return rows.view(-1, self.group_size).any(1)


@dataclass
class BlockRecord:
    """One block's result for B rows: argmax tokens [B, C], and per row its last step's canvas
    [B, C], self-conditioning signal [B, C, H], temperature [B] and token log-probs [B, C]."""

    tokens: Tensor
    canvas: Tensor
    signal: Tensor
    temperature: Tensor
    logp: Tensor

    def keep(self, fresh: Tensor, canvas: Tensor, signal: Tensor, temperature: float, logp: Tensor) -> None:
        """Record the step's inputs and log-probs for the `fresh` rows (those still denoising)."""
        self.canvas[fresh], self.signal[fresh], self.logp[fresh] = canvas[fresh], signal[fresh].to(self.signal), logp[fresh]
        self.temperature[fresh] = temperature


@torch.no_grad()
def denoise_block(model: nn.Module, prefix: PrefixCache, cfg: BlockDiffusionConfig, noise: GroupNoise,
                  frozen: Tensor, greedy: bool) -> BlockRecord:
    """Denoise one canvas after `prefix`. `frozen` rows ([B] bool: the rows of groups whose
    completions have all ended) are not denoised and their groups draw nothing; a row that ended in
    a group still going is denoised as `generate` denoises it (its tokens become pad)."""
    hf = diffusion_gemma(model)
    width = hf.config.canvas_length
    canvas = noise.uniform(noise.groups_with(~frozen), width)
    inputs = prefix.decoder_inputs(canvas)
    rows, hidden = canvas.shape[0], hf.config.text_config.hidden_size
    record = BlockRecord(canvas.clone(), canvas.clone(), torch.zeros(rows, width, hidden, dtype=hf.dtype,
                                                                     device=canvas.device),
                         torch.zeros(rows, device=canvas.device), torch.zeros(rows, width, device=canvas.device))
    stopping = CanvasStopping(cfg.stability_threshold, cfg.confidence_threshold)
    finished, previous = frozen.clone(), None
    for left in range(cfg.denoising_steps, 0, -1):
        seen: list[Tensor] = []
        with self_conditioning_signal(model, seen=seen):
            logits = model(decoder_input_ids=canvas, self_conditioning_logits=previous, **inputs).logits
        temperature = step_temperature(cfg, left)
        shaped = logits / temperature
        drawing = noise.groups_with(~finished)
        drawn = shaped.argmax(-1) if greedy else noise.categorical(torch.softmax(shaped, -1, dtype=torch.float32), drawing)
        argmax = shaped.argmax(-1)
        dist = torch.distributions.Categorical(logits=shaped)  # its logits: the normalised log-probs
        accept = entropy_bound_accept(dist.entropy(), cfg.entropy_bound)
        renoised = torch.where(accept, drawn, noise.uniform(drawing, width))
        fresh = ~finished
        record.keep(fresh, canvas, seen[0], temperature, dist.logits.gather(-1, argmax[..., None]).squeeze(-1).float())
        if finished.any():  # frozen rows keep their canvas, argmax and logits
            argmax = torch.where(finished[:, None], record.tokens, argmax)
            renoised = torch.where(finished[:, None], canvas, renoised)
            if previous is not None:
                shaped = torch.where(finished[:, None, None], previous, shaped)
        finished = finished | stopping(argmax, shaped)
        previous = shaped.to(hf.model.decoder.embed_tokens.weight.dtype)
        canvas, record.tokens = renoised, argmax
        if finished.all():
            break
    return record


def end_block(tokens: Tensor, ended: Tensor, eos_ids: Sequence[int], pad_id: int) -> tuple[Tensor, Tensor]:
    """A block's tokens as `generate` appends them (rows ended before: all pad; a first EOS: pad
    after it) and the rows ended after it."""
    is_eos = torch.isin(tokens, torch.tensor(list(eos_ids), device=tokens.device))
    seen = is_eos.cumsum(-1)
    after = (seen > 0) & ~((seen == 1) & is_eos)
    tokens = tokens.masked_fill(after | ended[:, None], pad_id)
    return tokens, ended | is_eos.any(-1)


@torch.no_grad()
def sample_block_diffusion(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, inputs: dict[str, Any],
                           cfg: BlockDiffusionConfig, blocks: int, eos_ids: Sequence[int], pad_id: int,
                           seeds: Sequence[int], group_size: int, greedy: bool = False) -> BlockDiffusionDraw:
    """`blocks` canvases for left-padded prompts [B, P] (rows grouped by `group_size`, group g from
    `seeds[g]`); `inputs`: the prompts' extra encoder inputs (images)."""
    BlockDiffusionConfig.check(cfg)
    hf = diffusion_gemma(model)
    device = prompt_ids.device
    noise = GroupNoise([torch.Generator(device=device).manual_seed(int(s)) for s in seeds], group_size,
                       hf.config.text_config.vocab_size)
    prefix = PrefixCache(model, prompt_ids, prompt_mask, inputs)
    ended = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=device)
    records: list[BlockRecord] = []
    for b in range(blocks):
        if b:
            prefix.append(records[-1].tokens)
        done = ended.view(-1, group_size).all(1).repeat_interleave(group_size)  # groups that have all ended
        record = denoise_block(model, prefix, cfg, noise, done, greedy)
        record.tokens, ended = end_block(record.tokens, ended, eos_ids, pad_id)
        records.append(record)
    return BlockDiffusionDraw(
        completion_ids=torch.cat([r.tokens for r in records], 1),
        logp=torch.cat([r.logp for r in records], 1),
        canvas=torch.stack([r.canvas for r in records], 1),
        self_conditioning=torch.stack([r.signal for r in records], 1),
        temperature=torch.stack([r.temperature for r in records], 1))
