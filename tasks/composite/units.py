"""How one `Rollout` holds the units of a composite policy's parts (docs/architecture.md, 'A composite
policy').

A composite rollout's units are its parts' units side by side, in the parts' order: the thinker's
tokens in columns [0, T) and the generator's units in [T, T + S), where each part's width is fixed by
its settings (T: the thinker's `max_units`, its most tokens; S: the generator's, its denoising steps),
so that a row's units sit in the same columns whatever batch it is drawn or scored in. A part whose
own rollout is narrower (the longest completion of the batch is shorter than T) is padded with units
that do not exist (mask 0, log-prob 0).

- `unit_mask` [N, T + S]: each part's own unit mask, padded to its width; 0 over a frozen part's
  columns (its units are drawn, not trained).
- `rollout_logp` [N, T + S]: each part's sampler log-probs, padded likewise (None if a part gives none).
- `extras`: each part's own extras under ``PART/NAME`` (``thinker/completion_ids``,
  ``generator/latents``, ...), and each part's own unit mask as ``PART/unit_mask`` [N, width of its
  own rollout]; `part_rollout` gives a part back the rollout it drew, with which its adapter's
  `logprobs` is called on the units slice that falls in its columns (shifted to its own).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from mmrl.core.rollout import Rollout


@dataclass(frozen=True)
class PartColumns:
    """Where a part's units sit in a composite rollout: columns [start, start + width)."""

    name: str
    start: int
    width: int

    @property
    def stop(self) -> int:
        return self.start + self.width

    def local(self, units: slice, own_width: int) -> tuple[slice, int] | None:
        """The part's own units slice inside the composite slice `units` of the part's columns, cut at
        its own rollout's width `own_width`, and the offset of its first unit in the slice's output;
        None where the slice holds none of them."""
        start, stop = max(units.start or 0, self.start), min(self.stop if units.stop is None else units.stop, self.stop)
        stop = min(stop, self.start + own_width)
        if start >= stop:
            return None
        return slice(start - self.start, stop - self.start), start - (units.start or 0)


def pad_units(values: Tensor, width: int) -> Tensor:
    """`values` [N, w] padded with 0 on the right to [N, width]."""
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def join_parts(base: Rollout, parts: dict[str, Rollout], columns: list[PartColumns],
               trained: dict[str, bool]) -> Rollout:
    """The composite rollout of `base` (the episode's own fields: group ids, prompts, completions,
    columns) and each part's own rollout (module docstring); the units of a part whose `trained` is
    False are masked out."""
    masks, logps, extras = [], [], {}
    for col in columns:
        own = parts[col.name]
        mask = own.unit_mask.float()
        masks.append(pad_units(mask if trained[col.name] else torch.zeros_like(mask), col.width))
        logps.append(None if own.rollout_logp is None else pad_units(own.rollout_logp.float(), col.width))
        extras.update({f"{col.name}/{key}": value for key, value in own.extras.items()})
        extras[f"{col.name}/unit_mask"] = own.unit_mask
    rollout_logp = None if any(lp is None for lp in logps) else torch.cat(logps, dim=1)
    return replace(base, unit_mask=torch.cat(masks, dim=1), rollout_logp=rollout_logp, extras=extras)


def part_rollout(batch: Rollout, col: PartColumns, completions: list | None = None) -> Rollout:
    """The rollout part `col` drew, as its adapter recorded it (its extras and unit mask; its sampler
    log-probs cut from the composite's), for the rows of `batch`; `completions`: the part's own (the
    thinker's text), else the batch's."""
    prefix = f"{col.name}/"
    extras = {key[len(prefix):]: value for key, value in batch.extras.items() if key.startswith(prefix)}
    mask = extras.pop("unit_mask")
    logp = None if batch.rollout_logp is None else batch.rollout_logp[:, col.start:col.start + mask.shape[1]]
    return Rollout(group_id=batch.group_id, prompts=batch.prompts,
                   completions=batch.completions if completions is None else completions, unit_mask=mask,
                   extras=extras, truncated=batch.truncated, rollout_logp=logp)
