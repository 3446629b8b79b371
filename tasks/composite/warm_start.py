"""The composite's supervised warm start (`warm_start.steps`): each trained part's own supervised
loss on its own target, summed. The thinker learns to write the row's `policy.thought_column` after
the row's prompt (through `policy.thinker_template`); the generator learns to draw the row's
`warm_start.target_column` from the prompt that text makes through `policy.prompt_template` (what
it is handed in a rollout when the thinker writes that text). A frozen part is not warm-started.
Apart, the parts' parameters are disjoint, so each part's gradient is its own loss's, as if
warm-started alone (AdamW per parameter; a global `warm_start.max_grad_norm` couples the two only
through the clip); shared (`policy.shared_weights`), the one module's gradient is the sum of both."""

from __future__ import annotations

from typing import Any, Sequence

from torch import Tensor, nn

from mmrl.errors import UserError

from .build import thinker_prompts
from .config import CompositeConfig
from .model import PartCall


def generator_rows(cfg: CompositeConfig, rows: Sequence[dict], prompt_of, generator_prompt_column: str) -> list[dict]:
    """The rows as the generator's warm start reads them: its prompt column the template of the row's
    thought text and prompt (refused, naming the row, where the thought column is missing)."""
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or row.get(cfg.thought_column) is None:
            raise UserError(f"warm start: row {i} has no policy.thought_column={cfg.thought_column!r} (the text the "
                            "thinker learns to write); add the column or set warm_start.steps=0")
        text = cfg.prompt_template.format(thought=str(row[cfg.thought_column]), prompt=str(prompt_of(row)))
        out.append({**row, generator_prompt_column: text})
    return out


def composite_supervised_loss(cfg: CompositeConfig, parts: dict[str, Any], model: nn.Module, rows: Sequence[dict],
                              target_column: str, trained: dict[str, bool]) -> Tensor:
    """The sum of the trained parts' warm-start losses (module docstring)."""
    thinker, generator = parts["thinker"], parts["generator"]
    drawn = generator_rows(cfg, rows, thinker.prompt_of, generator.prompt_column)
    losses = []
    if trained["thinker"]:
        own = thinker_prompts(cfg, list(rows), thinker.prompt_column, thinker.prompt_of)
        losses.append(thinker.supervised_loss(PartCall(model, "thinker"), own, cfg.thought_column))
    if trained["generator"]:
        losses.append(generator.supervised_loss(PartCall(model, "generator"), drawn, target_column))
    return sum(losses[1:], losses[0])
