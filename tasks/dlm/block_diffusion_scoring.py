"""The log-probs of DiffusionGemma's completion tokens (`policy.family: diffusion_gemma`), one block
(canvas) at a time: the prompt and the blocks before it encoded into the KV cache exactly as the
sampler encodes them (`PrefixCache`), then one decoder forward on a canvas, under grad.

Estimators (`policy.estimator`; docs/dlm.md says which of the masked family's carry over):

* ``final_step`` (the sampler's own): the canvas, self-conditioning signal and temperature of the
  block's last denoising step, recorded at rollout time, are replayed; logp_u = log softmax(z / T)
  of the token (the argmax the sampler kept). The self-conditioning signal is part of the state the
  step saw, as the canvas is (no gradient flows into the step before). It equals the rollout's
  log-probs (`Rollout.rollout_logp`) up to float rounding. Cost: one decoder forward per block.
* ``diffu_grpo`` (d1's one-step estimate, carried over): the canvas fully noised with uniform
  tokens drawn from the row's view seed (a fresh draw per update pass), no self-conditioning (the
  first denoising step's input), T = 1: the mean-field log p(y_u | prompt, earlier blocks, noise).
  Cost: one decoder forward per block.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from mmrl.core.seeding import derive_seed

from ..lm.token_logprobs import selective_log_softmax
from .block_diffusion import PrefixCache, diffusion_gemma, self_conditioning_signal
from .estimators import view_seed

IMAGE_KEYS = ("pixel_values", "image_position_ids")


def encoder_inputs(extras: dict[str, Any], device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
    """The prompts' image inputs for the encoder (none when no row has an image): the per-row
    pixel values and patch positions joined, and the per-token media types."""
    out: dict[str, Tensor] = {}
    for key in IMAGE_KEYS:
        parts = [t for t in extras.get(key, []) if t.numel()]
        if parts:
            joined = torch.cat(parts).to(device)
            out[key] = joined.to(dtype) if joined.is_floating_point() else joined
    if out and "prompt_mm_token_type_ids" in extras:
        out["mm_token_type_ids"] = extras["prompt_mm_token_type_ids"].to(device)
    return out


def block_canvas(estimator: str, extras: dict[str, Any], block: int, vocab: int, device: torch.device) -> Tensor:
    """The canvas [B, C] the estimator scores block `block` on."""
    if estimator == "final_step":
        return extras["final_canvas"][:, block].to(device)
    width = extras["final_canvas"].shape[2]
    pass_index = int(extras["mask_pass"])
    rows = []
    for seed in extras["mask_seed"].tolist():
        g = torch.Generator().manual_seed(derive_seed(view_seed(int(seed), pass_index), block))
        rows.append(torch.randint(0, vocab, (width,), generator=g))
    return torch.stack(rows).to(device)


def block_logprobs(model: nn.Module, extras: dict[str, Any], estimator: str, used: int,
                   with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, used] (and entropies) of the completion's first `used` tokens under `estimator`."""
    hf = diffusion_gemma(model)
    device = next(model.parameters()).device
    width, vocab = hf.config.canvas_length, hf.config.text_config.vocab_size
    completion = extras["completion_ids"].to(device)
    prefix = PrefixCache(model, extras["prompt_ids"].to(device), extras["prompt_mask"].to(device),
                         encoder_inputs(extras, device, hf.dtype))
    logps, entropies = [], []
    for b in range(-(-used // width)):
        if b:
            prefix.append(completion[:, (b - 1) * width:b * width])
        canvas = block_canvas(estimator, extras, b, vocab, device)
        inputs = prefix.decoder_inputs(canvas)
        if estimator == "final_step":
            with self_conditioning_signal(model, signal=extras["self_conditioning"][:, b].to(device)):
                logits = model(decoder_input_ids=canvas, **inputs).logits
            logits = logits / extras["final_temperature"][:, b, None, None].to(device)
        else:
            logits = model(decoder_input_ids=canvas, **inputs).logits
        lp, ent = selective_log_softmax(logits, completion[:, b * width:(b + 1) * width], with_entropy=with_entropy)
        logps.append(lp)
        entropies.append(ent)
    logp = torch.cat(logps, 1)[:, :used]
    return logp, (torch.cat(entropies, 1)[:, :used] if with_entropy else None)
