"""Dia's sampler: a group of completions drawn one decoder step at a time with a KV cache, the
encoder run once, under classifier-free guidance (conditional rows, then unconditional rows of zero
text, as transformers' Dia generation batches them). At each step the scores are `dia_steps.step_scores`;
the tokens the delay pattern fixes replace the drawn ones (the prompt's positions, each channel's eos
``delay`` steps after channel 0's, padding after it), as `DiaGenerationMixin` and
`DiaEOSDelayPatternLogitsProcessor` fix them, and channel 0's eos is forced after `max_new_frames` frames."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers.modeling_outputs import BaseModelOutput

from .dia_prompts import DiaPrompt
from .dia_steps import step_logprobs


def fixed_tokens(prompt: DiaPrompt, position: int, ends: Tensor, stopped: Tensor, delays: Tensor,
                 pad: int, eos: int) -> tuple[Tensor, Tensor]:
    """(is fixed [G, K], the fixed token [G, K]) at decoder `position`: the prompt's non-pad codes, each
    channel's eos at its row's end + delay, padding after it (`ends` [G]: channel 0's eos position)."""
    rows = len(ends)
    fixed = torch.full((rows, len(delays)), pad, dtype=torch.long, device=ends.device)
    if position < prompt.delay_mask.shape[0]:
        fixed[:] = prompt.delay_mask[position].to(ends.device)
    is_fixed = fixed != pad
    due = ends[:, None] + delays[None]  # [G, K]
    fixed = torch.where(stopped[:, None] & (position == due), eos, fixed)
    is_fixed = is_fixed | (stopped[:, None] & (position >= due))
    return is_fixed, torch.where(stopped[:, None] & (position > due), pad, fixed)


@torch.no_grad()
def draw_steps(policy: Any, prompt: DiaPrompt, group_size: int, generator: torch.Generator,
               greedy: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(decoder ids [G, W, K] from position 0, drawn [G, W, K] (not fixed), step log-probs [G, S] of the
    positions from `prompt.start` on, channel 0's eos position [G], whether it wrote it itself [G])."""
    model, cfg, device = policy.model, policy.cfg, policy.device
    delays = torch.tensor(policy.delays, device=device)
    guided = cfg.guidance_scale != 1
    text = prompt.text_ids.to(device).repeat(group_size, 1)
    if guided:
        text = torch.cat([text, torch.zeros_like(text)])
    ids = prompt.delay_mask[:prompt.start].to(device).repeat(group_size, 1, 1)
    drawn = torch.zeros_like(ids, dtype=torch.bool)
    ends = torch.full((group_size,), prompt.start + cfg.max_new_frames, dtype=torch.long, device=device)
    stopped = torch.zeros(group_size, dtype=torch.bool, device=device)
    ended = torch.zeros_like(stopped)
    encoded, cache, step_in, logps = None, None, ids, []
    for position in range(prompt.start, prompt.start + cfg.max_new_frames + int(delays.max()) + 1):
        out = model(input_ids=None if encoded is not None else text, attention_mask=torch.ones_like(text),
                    encoder_outputs=encoded, decoder_input_ids=torch.cat([step_in] * (2 if guided else 1)),
                    cache=cache, use_cache=True)
        encoded, cache = BaseModelOutput(last_hidden_state=out.encoder_last_hidden_state), out.cache
        logits = out.logits.reshape(-1, len(delays), step_in.shape[1], out.logits.shape[-1])[:, :, -1]
        scores, stops = policy.guided_scores(logits, group_size)
        probs = torch.softmax(scores.reshape(-1, scores.shape[-1]), dim=-1)
        tokens = (probs.argmax(-1) if greedy else torch.multinomial(probs, 1, generator=generator).squeeze(-1))
        tokens = tokens.reshape(group_size, len(delays))
        new_stop = ~stopped & (stops | (position == ends))
        ended |= ~stopped & stops
        ends = torch.where(new_stop, position, ends)
        stopped |= new_stop
        is_fixed, fixed = fixed_tokens(prompt, position, ends, stopped, delays, policy.pad, policy.eos)
        free = ~is_fixed
        free[:, 0] &= ~(new_stop & ~stops)  # an eos forced at the frame limit was not drawn
        tokens = torch.where(free, tokens, fixed)
        logps.append(step_logprobs(scores, tokens, free)[0])
        ids, drawn, step_in = torch.cat([ids, tokens[:, None]], 1), torch.cat([drawn, free[:, None]], 1), tokens[:, None]
        if bool((stopped & (position >= ends + int(delays.max()))).all()):
            break
    return ids, drawn, torch.stack(logps, 1), ends.cpu(), ended.cpu()
