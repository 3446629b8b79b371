"""A composite policy (`task: composite`): one episode made of two policies' units, a thinker's
tokens followed by a generator's units (an image's or a video's denoising steps), scored by one
reward (docs/architecture.md, 'A composite policy').

The thinker (any adapter whose completions are text: `causal_lm`, `vlm`, ...) writes from the row's
prompt; its text, through `policy.prompt_template`, is the prompt the generator (`diffusion`: any
image or video flow family) draws from; the rewards score the generator's completion, with the row's
prompt and data columns, and the thinker's text in the `thought` column. The engine gives every unit
of an episode its one group-relative advantage and sees no parts: each part is its own adapter, its
log-probs computed by that adapter on the units that fall in its columns (`units.py`), its module
one part of the trained module (`model.py`), with its own learning rate (`Policy.parameter_groups`),
its own LoRA, or frozen; or both parts run one unified model's module (`policy.shared_weights`,
`build.py`), one set of weights trained by both kinds of unit.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from mmrl.config.parse import from_dict
from mmrl.core.media import Medium
from mmrl.core.parallel import ParallelView
from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout
from mmrl.core.seeding import derive_seed
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS

from .build import build_parts, thinker_prompts
from .checks import composite_problems
from .config import PARTS, CompositeConfig
from .memory_formula import CompositeMemory, composite_memory
from .model import PartCall, composite_of
from .units import PartColumns, join_parts, part_rollout
from .warm_start import composite_supervised_loss


@ADAPTERS.register("composite")
class CompositePolicy(Policy):
    """The thinker and the generator (`parts`, each its own adapter) as one policy (module docstring)."""

    Config = CompositeConfig
    partial_backward = True  # a unit slice runs one part: the other's parameters get no gradient
    engine_lora_refused = ("gives each part its own LoRA: set policy.thinker_lora / policy.generator_lora and "
                           "leave optim.lora.r at 0")

    def __init__(self, cfg: CompositeConfig):
        problems = self.config_problems(cfg)
        if problems:
            raise ValueError(problems[0])
        self.cfg = cfg
        self.parts, self.model = build_parts(cfg)
        widths = [self.parts[name].max_units for name in PARTS]
        self.columns = [PartColumns(name, sum(widths[:i]), w) for i, (name, w) in enumerate(zip(PARTS, widths))]

    # ----- what is known before loading ---------------------------------------------------------
    @classmethod
    def config_problems(cls, cfg: CompositeConfig) -> list[str]:
        return composite_problems(cfg)

    @classmethod
    def memory_model(cls, cfg: CompositeConfig, prompt_length: int) -> CompositeMemory:
        """tasks/composite/memory_formula.py: the parts' own formulas, one part's pass at a time."""
        return composite_memory(cfg, prompt_length)

    @classmethod
    def _part_class(cls, cfg: CompositeConfig, name: str) -> tuple[type[Policy], Any]:
        adapter = ADAPTERS.get(cfg.part_task(name))
        return adapter, from_dict(adapter.Config, cfg.part_settings(name), f"policy.{name}")

    @classmethod
    def output_kind(cls, cfg: CompositeConfig) -> str | None:
        return cls._part_class(cfg, "generator")[0].output_kind(cls._part_class(cfg, "generator")[1])

    @classmethod
    def rollout_columns(cls, cfg: CompositeConfig) -> tuple[str, ...]:
        adapter, own = cls._part_class(cfg, "generator")
        return (*adapter.rollout_columns(own), "thought")

    @classmethod
    def prompt_check(cls, cfg: CompositeConfig):
        adapter, own = cls._part_class(cfg, "thinker")
        return adapter.prompt_check(own)

    @classmethod
    def media_columns(cls, cfg: CompositeConfig) -> dict[str, Callable[[Any], None]]:
        adapter, own = cls._part_class(cfg, "thinker")
        return adapter.media_columns(own)

    @classmethod
    def required_columns(cls, cfg: CompositeConfig) -> dict[str, str]:
        adapter, own = cls._part_class(cfg, "thinker")
        return adapter.required_columns(own)

    # ----- the parts ------------------------------------------------------------------------------
    def use_parallel(self, view: ParallelView) -> None:
        if view.gathers_in_module_calls:  # 2 processes left the generator 7e-4 from 1 process's after a KL step
            raise UserError(f"task composite under {view.description}: not equal to one process there (the "
                            "generator's weights differ after a step with a KL term); use a strategy that gathers "
                            "whole parts (docs/distributed.md)")
        super().use_parallel(view)
        for part in self.parts.values():
            part.use_parallel(view)

    def set_training_step(self, step: int) -> None:
        for part in self.parts.values():
            part.set_training_step(step)

    @property
    def prompt_column(self) -> str:
        """The data column of the prompt (set by the engine), which the thinker reads."""
        return self.parts["thinker"].prompt_column

    @prompt_column.setter
    def prompt_column(self, column: str) -> None:
        self.parts["thinker"].prompt_column = column

    @property
    def max_units(self) -> int:
        return self.columns[-1].stop

    def trained(self, name: str) -> bool:
        return self.cfg.freeze != name

    def parameter_groups(self, model: nn.Module, lr: float) -> list[dict[str, Any]]:
        """One group per trained part, at its own learning rate (`policy.thinker_lr`, `generator_lr`)."""
        if hasattr(model, "peft_config"):  # refused with the recipe; a model wrapped since is refused here
            raise UserError(f"task composite {self.engine_lora_refused}")
        whole = composite_of(model)  # a part that shares another's module has no group of its own
        return [{"params": [p for p in whole.part(name).parameters() if p.requires_grad],
                 "lr": self.cfg.part_lr(name, lr)} for name in PARTS if self.trained(name) and name not in whole.shared]

    def pop_metrics(self) -> dict[str, float]:
        return {f"{name}/{k}": v for name, part in self.parts.items() for k, v in part.pop_metrics().items()}

    # ----- rollouts -------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int],
                greedy: bool = False) -> Rollout:
        """One episode per row, in three phases:
        1. the thinker writes `group_size` texts of each prompt, group g from `seeds[g]`;
        2. the generator draws one completion of each text (its prompt: `policy.prompt_template`), row k
           of group g from a seed derived from `seeds[g]` and k, so a group depends on its prompt and seed
           alone;
        3. the record: the generator's completions and columns, the thinker's text as `thought`, and the
           parts' units side by side (`units.join_parts`)."""
        thinker, generator = self.parts["thinker"], self.parts["generator"]
        own_rows = thinker_prompts(self.cfg, list(prompts), thinker.prompt_column, self.prompt_of)
        thought = thinker.rollout(own_rows, group_size, seeds, greedy)
        rows = thought.group_id.tolist()
        own_prompts = [str(self.prompt_of(prompts[g])) for g in rows]
        texts = [self.cfg.prompt_template.format(thought=str(c), prompt=p)
                 for c, p in zip(thought.completions, own_prompts)]
        row_seeds = [derive_seed(seeds[g], k) for g, k in zip(rows, _index_in_group(rows))]
        drawn = generator.rollout(texts, 1, row_seeds, greedy)
        shown = thought.prompts if own_rows == list(prompts) else own_prompts  # the rows' own, not the template's
        base = Rollout(group_id=thought.group_id, prompts=shown, completions=drawn.completions,
                       unit_mask=thought.unit_mask, columns={**drawn.columns, "thought": list(thought.completions)},
                       truncated=thought.truncated, auxiliary=thought.auxiliary)
        columns = self.columns if not greedy else self._columns_of({"thinker": thought, "generator": drawn})
        return join_parts(base, {"thinker": thought, "generator": drawn}, columns,
                          {name: self.trained(name) for name in PARTS})

    def _columns_of(self, parts: dict[str, Rollout]) -> list[PartColumns]:
        """The columns of parts whose rollouts may be wider than their training widths (a greedy rollout's
        evaluation steps)."""
        widths = [max(col.width, parts[col.name].num_units) for col in self.columns]
        return [PartColumns(name, sum(widths[:i]), w) for i, (name, w) in enumerate(zip(PARTS, widths))]

    def concat(self, parts: Sequence[Rollout]) -> Rollout:
        """Each part's rollouts joined by its own adapter (its padding), the episodes' fields row-wise."""
        if len(parts) == 1:
            return parts[0]
        own = {col.name: self.parts[col.name].concat([self._part(p, col) for p in parts]) for col in self.columns}
        base = Rollout.concat([replace(p, extras={}, unit_mask=p.unit_mask[:, :0], rollout_logp=None) for p in parts])
        return join_parts(base, own, self.columns, {name: self.trained(name) for name in PARTS})

    def _part(self, batch: Rollout, col: PartColumns) -> Rollout:
        return part_rollout(batch, col, batch.columns.get("thought") if col.name == "thinker" else None)

    # ----- log-probs ------------------------------------------------------------------------------
    def unit_slices(self, batch: Rollout) -> list[slice]:
        """Each trained part's own slices (a denoising step at a time for a diffusion generator),
        shifted to its columns."""
        slices = []
        for col in self.columns:
            if not self.trained(col.name) or not batch.unit_mask[:, col.start:col.stop].any():
                continue
            sub = self._part(batch, col)
            for own in self.parts[col.name].unit_slices(sub):
                start, stop, _ = own.indices(sub.num_units)
                slices.append(slice(col.start + start, col.start + stop))
        return slices

    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False, skip: tuple[str, ...] = ()) -> tuple[Tensor, Tensor | None]:
        """fp32 log-probs [B, u] of the units in `units`: each trained part's from its own adapter, on its
        own rollout and the slice of its units (`units.PartColumns.local`), 0 over a frozen part's and
        padding units (and over the parts in `skip`, left to the caller)."""
        start, stop, _ = units.indices(batch.num_units)
        logp = torch.zeros(len(batch), stop - start)
        entropy = torch.zeros(len(batch), stop - start) if with_entropy else None
        for col in self.columns:
            if not self.trained(col.name) or col.name in skip:
                continue
            sub = self._part(batch, col)
            found = col.local(slice(start, stop), sub.num_units)
            if found is None:
                continue
            own, at = found
            lp, ent = self.parts[col.name].logprobs(PartCall(model, col.name), sub, own, with_entropy)
            logp = logp.to(lp.device)
            logp[:, at:at + lp.shape[1]] = lp.float()
            if with_entropy and ent is not None:
                entropy = entropy.to(ent.device)
                entropy[:, at:at + ent.shape[1]] = ent.float()
        return logp, entropy

    def logprobs_and_kl(self, model: nn.Module, reference: Callable[[], AbstractContextManager[nn.Module]],
                        batch: Rollout, units: slice = slice(None),
                        with_entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """`logprobs` and each unit's closed-form KL [B, u] (`algorithm.kl_estimator: closed_form`): the
        generator's own (its step Gaussians' KL, or UniGRPO's velocity MSE with its `kl_form: velocity_mse`);
        0 on the thinker's tokens, which have none (UniGRPO regularises the drawing alone)."""
        start, stop, _ = units.indices(batch.num_units)
        logp, entropy = self.logprobs(model, batch, slice(start, stop), with_entropy, skip=("generator",))
        kl = torch.zeros_like(logp)
        col = self.columns[-1]
        sub = self._part(batch, col)
        found = col.local(slice(start, stop), sub.num_units) if self.trained(col.name) else None
        if found is not None:
            own, at = found
            lp, ent, own_kl = self.parts[col.name].logprobs_and_kl(
                PartCall(model, col.name), partial(_part_reference, reference, col.name), sub, own, with_entropy)
            width = lp.shape[1]
            logp, kl = logp.to(lp.device), kl.to(lp.device)
            logp[:, at:at + width], kl[:, at:at + width] = lp.float(), own_kl.float()
            if with_entropy and ent is not None:
                entropy = entropy.to(ent.device)
                entropy[:, at:at + width] = ent.float()
        return logp, entropy, kl

    def unit_clip(self, batch: Rollout, units: slice, eps: tuple[float, float]) -> tuple[Tensor, Tensor] | None:
        """Each unit's (eps_low, eps_high) [B, u]: its part's `policy.PART_clip`, else the recipe's `eps`."""
        if all(self.cfg.part_clip(name) is None for name in PARTS):
            return None
        start, stop, _ = units.indices(batch.num_units)
        low, high = torch.full((len(batch), stop - start), eps[0]), torch.full((len(batch), stop - start), eps[1])
        for col in self.columns:
            own, a, b = self.cfg.part_clip(col.name), max(start, col.start), min(stop, col.stop)
            if own is not None and a < b:
                low[:, a - start:b - start], high[:, a - start:b - start] = own
        return low, high

    def supervised_loss(self, model: nn.Module, rows: Sequence[dict], target_column: str) -> Tensor:
        """The warm start: each trained part's own loss, summed (`warm_start.py`)."""
        return composite_supervised_loss(self.cfg, self.parts, model, rows, target_column,
                                         {name: self.trained(name) for name in PARTS})

    # ----- what users see, and checkpoints ---------------------------------------------------------
    def sample_medium(self, completion: Any, columns: dict[str, Any]) -> Medium:
        return self.parts["generator"].sample_medium(completion, columns)

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        """Each part as its adapter writes it (a LoRA adapter or whole weights), in `path/thinker` and
        `path/generator`; the one module of `policy.shared_weights` in `path`, as the thinker writes it."""
        whole = composite_of(model)
        for name in PARTS:
            if name in whole.shared:
                continue
            prefix = f"parts.{name}."
            own = None if state_dict is None else {k[len(prefix):]: v for k, v in state_dict.items()
                                                   if k.startswith(prefix)}
            self.parts[name].save_pretrained(whole.part(name), Path(path) / ("" if whole.shared else name), own)


@contextmanager
def _part_reference(reference: Callable[[], AbstractContextManager[nn.Module]], name: str) -> Iterator[PartCall]:
    """The reference's part `name`, as its adapter enters a reference."""
    with reference() as whole:
        yield PartCall(whole, name)


def _index_in_group(groups: list[int]) -> list[int]:
    """Each row's index within its group (rows of a group are consecutive)."""
    seen: dict[int, int] = {}
    out = []
    for g in groups:
        out.append(seen.get(g, 0))
        seen[g] = out[-1] + 1
    return out
