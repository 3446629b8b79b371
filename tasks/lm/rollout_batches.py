"""Token rollouts as batches, shared by the token adapters (causal_lm, the multimodal ones, dlm):
where a completion ends, joining rollouts of different widths, and log-probs computed on the
columns some row uses and given back at the batch's full width."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout


def eos_token_ids(model: nn.Module, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the model's generation config's eos id(s), else the tokenizer's."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None) or tokenizer.eos_token_id
    return eos if isinstance(eos, list) else [eos]


def first_eos_ends(completion_ids: Tensor, eos_ids: Sequence[int]) -> Tensor:
    """Per row, 1 + the index of its first eos token, or width + 1 when it has none."""
    width = completion_ids.shape[1]
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    pos = torch.arange(width, device=completion_ids.device)
    return torch.where(is_eos, pos + 1, width + 1).min(dim=1).values


def units_before(end: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """(unit mask [B, width] in fp32: the columns before each row's `end`; truncated [B]: the
    rows whose end lies past `width`)."""
    pos = torch.arange(width, device=end.device)
    return (pos[None, :] < end[:, None]).to(torch.float32), end > width


def concat_padded(parts: Sequence[Rollout], pad_token_id: int) -> Rollout:
    """Join token rollouts: prompt tensors (`prompt_*` extras) padded on the left to a common
    width (ids with `pad_token_id`, the others with 0), completion tensors (`completion_*` extras:
    ids with `pad_token_id`, an episode's turns with -1, the others with 0), the unit mask and the
    rollout log-probs on the right."""
    p_width = max(r.extras["prompt_ids"].shape[1] for r in parts)
    c_width = max(r.num_units for r in parts)
    fixed = []
    for r in parts:
        dp, dc = p_width - r.extras["prompt_ids"].shape[1], c_width - r.num_units
        extras = dict(r.extras)
        for key, value in r.extras.items():
            if key.startswith("prompt_") and isinstance(value, Tensor):
                extras[key] = nn.functional.pad(value, (dp, 0), value=pad_token_id if key == "prompt_ids" else 0)
            elif key.startswith("completion_") and isinstance(value, Tensor):  # ids, an episode's per-token extras
                fill = {"completion_ids": pad_token_id, "completion_turn": -1}.get(key, 0)
                extras[key] = nn.functional.pad(value, (0, dc), value=fill)
        logp = nn.functional.pad(r.rollout_logp, (0, dc)) if r.rollout_logp is not None else None
        fixed.append(replace(r, unit_mask=nn.functional.pad(r.unit_mask, (0, dc)), extras=extras,
                             rollout_logp=logp))
    return Rollout.concat(fixed)


def used_width(unit_mask: Tensor) -> int:
    """The columns up to the last one some row of the batch uses (at least 1): the all-padding
    tail is not scored (an episode's tool tokens between its units are)."""
    used = unit_mask.any(0).nonzero()
    return max(int(used[-1]) + 1 if len(used) else 0, 1)


def full_width(logp: Tensor, entropy: Tensor | None, width: int,
               units: slice) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) [B, used] of the used columns padded with 0 to the batch's
    `width`, then the `units` asked for."""
    logp = nn.functional.pad(logp, (0, width - logp.shape[1]))
    if entropy is not None:
        entropy = nn.functional.pad(entropy, (0, width - entropy.shape[1]))
    return logp[:, units], (entropy[:, units] if entropy is not None else None)
