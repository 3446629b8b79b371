"""The loop, the same for every family: sample prompts -> rollout -> rewards -> advantages ->
`mu` update passes over streamed micro-batches -> log -> checkpoint, under `accelerate`.

Distribution: the step's prompt groups are split into contiguous blocks, one per process; each
group is sampled from its own seed (run seed, step, attempt, group index), so rollouts do not
depend on the number of processes. Rewards are gathered so every process computes the same
advantages and aggregation normaliser over the whole batch; each process's loss is a partial
sum of the batch loss, scaled by the world size because data-parallel backends average gradients.
"""

from __future__ import annotations

import copy
import logging
import math
import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from torch import Tensor

from . import checkpoint as ckpt
from . import run_dir
from .advantages import (check_reward_combine, combined_total, compute_advantages, group_variance_mask,
                         row_magnitude)
from .config import TrainConfig, from_dict, to_dict
from .data import Rows, load_data, reward_columns_needed
from .distributed import SHARDS_DIR, Sharding, local_tensor, with_launcher_settings
from .errors import UserError, reading_user_input
from .evaluate import evaluate
from .loss import (AGGREGATIONS, OBJECTIVES, closed_form_kl, metric_names, ratio_segments, reference_pass,
                   regulariser_needs)
from .policy import Policy
from .registry import ADAPTERS, import_user_module, load_plugins
from .reward_registry import (ENGINE_COLUMNS, ColumnBoundReward, RewardFn, bind_reward, column_checks, score_completions,
                              score_rollout)
from .rollout import Rollout
from .rollout_correction import add_sums, importance_weights, mismatch_metrics, mismatch_sums
from .sampling import PromptSampler, derive_seed
from .signals import RunInterrupted, StopSignals
from . import zero
from .stages import Stage, StagePlan
from .tracking import Progress, Tracker
from .validate import check_world_size, validate


class NonFiniteError(UserError):
    """`max_bad_steps` optimizer steps in a row had a NaN/inf loss or gradient norm."""

logger = logging.getLogger(__name__)
_UNSET = object()  # a policy field a stage's recipe does not give


@dataclass
class StepBatch:
    """This process's share of a step, with the batch-wide quantities it needs."""

    rollout: Rollout               # local rows
    advantages: Tensor             # local [n] or [n, U]
    row_mask: Tensor               # local [n] bool: rows that take part in the loss
    weights: Tensor                # local [n, U]: aggregation weights over the whole batch
    metrics: dict[str, float]


@dataclass
class ShareCounts:
    """One process's share of a step's batch, gathered from every process before the loss so the
    aggregation is taken over the whole batch."""

    units: float                   # trained units (unit_mask x row_mask)
    rows: float                    # rows that take part in the loss
    width: int                     # U, the units of the widest rollout (0 for no rows)
    lengths: list[float]           # each row's unit count (completion length)
    truncated: list[bool]          # each row cut at the length limit (empty: not reported)


@dataclass
class MicroBatchCounts:
    """One process's micro-batch plan, gathered so every process runs as many backward passes."""

    chunks: int                    # micro-batches
    active: int                    # rows that run (carry a gradient)
    rows: int                      # rows that take part in the loss


def add_counts(into: dict[str, float], counts: dict[str, float]) -> None:
    for key, value in counts.items():
        into[key] = into.get(key, 0.0) + value


def batch_positions(batch_group_id: Tensor, local_group_id: Tensor) -> Tensor:
    """Where a process's rows sit in the whole batch: rows of a group keep their order, and
    groups are matched by id (under dynamic sampling a process's groups are not contiguous)."""
    positions = [(batch_group_id == g).nonzero().flatten() for g in torch.unique_consecutive(local_group_id)]
    return torch.cat(positions) if positions else torch.zeros(0, dtype=torch.long)


def load_validated_data(cfg: TrainConfig, reward_fns: dict[str, RewardFn]) -> tuple[Rows, Rows]:
    """The data set, validated before any model loads: prompt column, every column a reward needs
    (through its column bindings) and the values rewards check, the adapter's media columns; reward bindings that clash with
    a data column are errors."""
    adapter = ADAPTERS.get(cfg.task)
    media = adapter.media_columns(from_dict(adapter.Config, cfg.policy, "policy"))
    bindings = {name: spec.columns for name, spec in cfg.rewards.items()}
    required = reward_columns_needed(reward_fns, bindings, provided=ENGINE_COLUMNS)
    values = column_checks({name: (spec.args, spec.columns) for name, spec in cfg.rewards.items()})
    train, held_out = load_data(cfg.data, media, required, values)
    columns = list(train[0]) if len(train) else []
    for fn in reward_fns.values():
        bound = fn if isinstance(fn, ColumnBoundReward) else getattr(fn, "func", None)
        if isinstance(bound, ColumnBoundReward):
            bound.check(columns)
    return train, held_out


def build_policy(cfg: TrainConfig) -> Policy:
    adapter = ADAPTERS.get(cfg.task)
    return adapter(from_dict(adapter.Config, cfg.policy, "policy"))


class Trainer:
    @reading_user_input()  # what goes wrong while reading the recipe, data and model paths is the user's to fix
    def __init__(self, cfg: TrainConfig, accelerator: Accelerator | None = None, for_training: bool = True):
        """`for_training=False` (scoring a checkpoint) neither claims `cfg.output_dir` nor resumes."""
        load_plugins()
        for module in cfg.reward_modules:
            import_user_module(module)
        if not cfg.rewards:
            raise ValueError("rewards: name at least one reward (see `mmrl --help` for the registered ones)")
        cfg = with_launcher_settings(cfg)  # `accelerate launch` with an FSDP config: mmrl shards
        self.zero3 = cfg.distributed.strategy == "zero3"  # DeepSpeed ZeRO-3 (mmrl/zero.py)
        if self.zero3:
            if accelerator is not None:
                raise ValueError("distributed.strategy=zero3: the trainer builds its own DeepSpeed accelerator")
            accelerator = zero.accelerator(cfg, zero.DTYPES.get(cfg.policy.get("dtype", "float32"), torch.float32))
        self.accelerator = accelerator or Accelerator()
        acc = self.accelerator
        check_world_size(acc.num_processes)
        validate(cfg, acc.num_processes)  # the whole recipe, before any model, data set or reward model loads
        self.plan = StagePlan(cfg)  # training stages (mmrl/stages.py)
        self.output_dir = Path(cfg.output_dir)
        resume_from = None
        if for_training:
            say = print if acc.is_main_process else (lambda *a, **k: None)
            resume_from = run_dir.claim(self.output_dir, cfg.resume, cfg.overwrite, acc.is_main_process, say)
            acc.wait_for_everyone()
        # start in the stage of the checkpoint's last step
        self.stage = self.plan.stage_at(int(ckpt.read_trainer_state(resume_from)["step"]) if resume_from else 0)
        if self.plan.staged and cfg.max_steps < self.plan.planned_steps and acc.is_main_process:
            logger.warning("max_steps=%d ends the run in stage %d of the stages' %d planned steps", cfg.max_steps,
                           self.plan.stage_at(cfg.max_steps).index, self.plan.planned_steps)
        cfg = self.cfg = self.stage.config
        algo = cfg.algorithm
        self.objective = OBJECTIVES.get(algo.objective)
        self.reward_fns = {name: bind_reward(name, spec.args, spec.columns) for name, spec in cfg.rewards.items()}
        self.reward_weights = {name: spec.weight for name, spec in cfg.rewards.items()}
        if cfg.sampling.variance_reward is not None and cfg.sampling.variance_reward not in self.reward_weights:
            raise ValueError(f"sampling.variance_reward={cfg.sampling.variance_reward!r} is not one of the "
                             f"rewards {sorted(self.reward_weights)}")
        check_reward_combine(algo.reward_combine, algo.gates, self.reward_weights)
        self.train_rows, self.eval_rows = load_validated_data(cfg, self.reward_fns)

        torch.manual_seed(cfg.seed)  # model construction and LoRA init are identical on every process
        self.policy = build_policy(cfg)
        self.policy.prompt_column = cfg.data.prompt_column
        if cfg.policy.get("device") is None:
            self.policy.model.to(acc.device)
        self.sharding: Sharding | None = None
        self._idle_row: Rollout | None = None  # a row of this process's latest draw (sharded passes at zero)
        if cfg.distributed.strategy == "fsdp":
            # the adapter's dtype becomes the compute dtype; weights and AdamW state stay fp32
            compute = next(p.dtype for p in self.policy.model.parameters() if p.is_floating_point())
            self.sharding = Sharding(cfg.distributed, acc.device, compute)
            self.policy.model.float()
            self.policy.synced_rollouts = cfg.distributed.rollout_params == "sharded"
        elif self.zero3:  # the dtype is DeepSpeed's compute dtype (engine_config); fp32 master weights
            self.policy.model.float()
            self.policy.synced_rollouts = True
        self.sharded = self.sharding is not None or self.zero3  # every process runs as many passes
        self.lora = cfg.optim.lora.r > 0
        if self.lora:
            from peft import LoraConfig, get_peft_model
            lora = cfg.optim.lora
            self.policy.model = get_peft_model(self.policy.model, LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules))
        self.reference = None
        if any(regulariser_needs(s.config.algorithm, "reference") for s in self.plan.stages) and not self.lora:
            self.reference = copy.deepcopy(self.policy.model).eval().requires_grad_(False)
            if self.sharding is not None:  # a frozen sharded copy, never a whole replica per process
                self.sharding.shard(self.reference, "the reference model")
            elif self.zero3:
                self.reference = zero.frozen_sharded(self.reference, cfg, zero.DTYPES[cfg.policy.get("dtype", "float32")])
        if self.sharding is not None:
            self.sharding.shard(self.policy.model)
        self.policy.model.train()
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        # the fused kernel (CPU and CUDA) is several times faster than the per-tensor loop
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
        optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                                      betas=tuple(cfg.optim.betas), fused=fused or None)
        from transformers import get_scheduler
        self.scheduler = get_scheduler(cfg.optim.schedule, optimizer, num_warmup_steps=cfg.optim.warmup_steps,
                                       num_training_steps=max(cfg.max_steps, 1))
        if self.sharding is None:
            self.model, self.optimizer = acc.prepare(self.policy.model, optimizer)
        else:  # sharded in place: the module is the model; checkpoints hold its shards (save_checkpoint)
            self.model, self.optimizer = self.policy.model, optimizer
        acc.register_for_checkpointing(self.scheduler)
        self.sampler = PromptSampler(self.train_rows, cfg.sampling, self.plan.sampler_seed(self.stage))
        self.step = 0
        self.bad_steps = 0  # optimizer steps skipped in a row for a non-finite loss or gradient
        self.nonfinite_term: str | None = None  # of the latest step: "loss", "gradient norm" or None
        self.last_eval: tuple[int, float] | None = None  # (step, eval reward_mean) of the latest eval
        if resume_from is not None:
            self.load_checkpoint(resume_from)
        self.resumed = resume_from is not None

    # ----- helpers ----------------------------------------------------------------------------
    @property
    def unwrapped(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def _local_groups(self, num_groups: int) -> range:
        per = num_groups // self.accelerator.num_processes
        start = self.accelerator.process_index * per
        return range(start, start + per)

    @contextmanager
    def _reference_model(self):
        """The reference module: the frozen copy, or the model with its LoRA adapter disabled."""
        if self.reference is not None:
            yield self.reference
        else:
            with self.unwrapped.disable_adapter():
                yield self.model

    def _gathered(self, model: torch.nn.Module | None = None, always: bool = False):
        """Under fsdp with `distributed.rollout_params: gathered` (or `always`), `model`'s (default:
        the policy's) parameters gathered for no-grad passes: rollouts, evaluation, old and
        reference log-probs, whose forward counts may then differ between processes."""
        if self.sharding is None or not (always or self.cfg.distributed.rollout_params == "gathered"):
            return nullcontext()
        return self.sharding.gathered(model if model is not None else self.model)

    def _rollout_params(self):
        """`_gathered()` for rollouts and evaluation, unless the policy samples with an engine of its
        own (vLLM), whose weight sync gathers the sharded policy one unit at a time."""
        return self._gathered() if self.policy.rollout_runs_model else nullcontext()

    @property
    def _forwards_in_step(self) -> bool:
        """No-grad passes run on sharded parameters: every process runs as many forwards."""
        return self.zero3 or (self.sharding is not None and self.cfg.distributed.rollout_params == "sharded")

    @property
    def _closed_form_kl(self) -> bool:
        return closed_form_kl(self.cfg.algorithm)

    def _gather(self, obj: Any) -> list[Any]:
        """One object from each process, in process order (the identity on one process)."""
        if self.accelerator.num_processes == 1:
            return [obj]
        return gather_object([obj])

    # ----- one step ---------------------------------------------------------------------------
    def _rollout_groups(self, step: int, attempt: int) -> tuple[Rollout, list[int], dict[str, Tensor],
                                                               dict[str, float], dict[str, Tensor]]:
        """Roll out this process's groups of one draw; return them with the draw's indices, the
        rewards of the WHOLE draw (gathered, in global row order), the rewards' own metrics and the
        rewards of the whole draw's auxiliary rows (gathered; dropped from the rollout)."""
        cfg = self.cfg
        group_size = cfg.algorithm.group_size
        indices = self.sampler.draw(step, cfg.optim.prompts_per_step, attempt)
        local = self._local_groups(len(indices))
        rows = [self.train_rows[indices[g]] for g in local]
        seeds = [derive_seed(cfg.seed, step, attempt, g) for g in local]
        with self._rollout_params():
            rollout = self.policy.rollout(rows, group_size, seeds)
        self._idle_row = rollout.select([0])
        rollout.group_id = rollout.group_id + local.start + attempt * len(indices)
        rollout.add_data_columns(rows)
        reward_counts: dict[str, float] = {}  # what the rewards log about this draw's calls
        rollout, rewards, auxiliary = score_rollout(self.reward_fns, rollout, reward_counts)
        # turning-point passes: as many as each process's samples need (an adapter without step rewards runs none)
        step_level = type(self.policy).step_rewards is not Policy.step_rewards
        with self._gathered(always=True) if step_level else nullcontext():
            per_unit = self.policy.step_rewards(rollout, lambda picked, completions: score_completions(
                self.reward_fns, rollout, picked, completions, reward_counts))
        if per_unit is not None:  # step-level credit: these replace the rollout rewards
            rewards = per_unit
        counts = {**reward_counts, **{f"policy/{k}": v for k, v in self.policy.pop_metrics().items()}}
        gathered = self._gather(({k: v.tolist() for k, v in rewards.items()}, counts,
                                 {k: v.tolist() for k, v in auxiliary.items()}))
        full = {k: torch.tensor([x for part, _, _ in gathered for x in part[k]]) for k in rewards}
        extra: dict[str, float] = {}
        for _, counts, _ in gathered:
            add_counts(extra, counts)
        auxiliary = {k: torch.tensor([x for _, _, part in gathered for x in part[k]]) for k in auxiliary}
        return rollout, indices, full, extra, auxiliary

    def _collect(self, step: int) -> tuple[Rollout, dict[str, Tensor], Tensor, dict[str, float]]:
        """This process's rollouts, and the WHOLE batch's rewards and group ids, for a step; with
        DAPO dynamic sampling, keep drawing until `prompts_per_step` groups have non-zero reward
        variance (or tries run out). Group ids are unique across draws."""
        cfg = self.cfg
        samp = cfg.sampling
        need = cfg.optim.prompts_per_step
        tries = samp.dynamic_max_tries if samp.dynamic else 1
        local_parts, reward_parts, gid_parts = [], [], []
        kept_groups = attempt = 0
        reward_extra: dict[str, float] = {}
        auxiliary_parts = []
        for attempt in range(tries):
            rollout, indices, rewards, extra, auxiliary = self._rollout_groups(step, attempt)
            add_counts(reward_extra, extra)
            auxiliary_parts.append(auxiliary)
            draw_gid = torch.arange(len(indices)).repeat_interleave(cfg.algorithm.group_size)
            total = combined_total(rewards, self.reward_weights, cfg.algorithm.reward_combine, cfg.algorithm.gates)
            outcome = total if samp.variance_reward is None else rewards[samp.variance_reward]
            self.sampler.update(indices, outcome if outcome.dim() == 1 else outcome.nanmean(1), draw_gid)  # [N, U]: row means
            keep = group_variance_mask(total, draw_gid) if samp.dynamic else torch.ones(len(indices), dtype=torch.bool)
            keep &= torch.cumsum(keep, 0) <= need - kept_groups  # no more groups than the batch needs
            local_part = rollout.select(keep[rollout.group_id - attempt * len(indices)].nonzero().flatten())
            if len(local_part):
                local_parts.append(local_part)
            reward_parts.append({k: v[keep[draw_gid]] for k, v in rewards.items()})
            gid_parts.append((draw_gid + attempt * len(indices))[keep[draw_gid]])
            kept_groups += int(keep.sum())
            if kept_groups >= need:
                break
        if not local_parts:  # this process kept no group: an empty rollout of the right kind
            local_parts.append(rollout.select([]))
        local = self.policy.concat(local_parts) if len(local_parts) > 1 else local_parts[0]
        rewards = {k: torch.cat([p[k] for p in reward_parts]) for k in reward_parts[0]}
        stats = {"sampling/tries": float(attempt + 1), "sampling/groups": float(kept_groups), **reward_extra}
        for k in auxiliary_parts[0]:  # e.g. T-GRPO's shuffled-frame accuracy beside reward/<name>
            values = torch.cat([p[k] for p in auxiliary_parts])
            if not values.isnan().all():
                stats[f"auxiliary/reward/{k}"] = float(values.nanmean())
        stats.update(self.sampler.stats())
        return local, rewards, torch.cat(gid_parts), stats

    def prepare_batch(self, step: int) -> StepBatch:
        """Step `step`'s rollouts, rewards, advantages and aggregation weights: this process's share
        of the batch, ready for `accumulate_gradients` (what `train_step` does before updating)."""
        algo = self.cfg.algorithm
        local, rewards, group_id, metrics = self._collect(step)
        adv = compute_advantages(rewards, self.reward_weights, group_id, algo)
        n = len(local)
        rows = batch_positions(group_id, local.group_id)
        whole = adv.advantages
        if self.objective.row_coefficients is not None:
            if whole.dim() != 1:
                raise ValueError(f"algorithm.objective={algo.objective!r} needs one advantage per row, "
                                 "not step-level rewards")
            whole = self.objective.row_coefficients(whole, group_id, adv.row_mask)
        advantages, row_mask = whole[rows], adv.row_mask[rows]
        if algo.prune_threshold > 0:
            small = row_magnitude(advantages) < algo.prune_threshold
            row_mask = row_mask & ~small
        unit_mask = local.unit_mask * row_mask[:, None]
        truncated = local.truncated.tolist() if local.truncated is not None else []
        counts: list[ShareCounts] = self._gather(ShareCounts(
            float(unit_mask.sum()), float(row_mask.sum()), local.num_units if n else 0,
            local.unit_mask.sum(1).tolist(), truncated))
        total_units = max(sum(c.units for c in counts), 1.0)
        total_rows = max(sum(c.rows for c in counts), 1.0)
        max_units = algo.max_units or self.policy.max_units or max(c.width for c in counts)
        weights = AGGREGATIONS.get(algo.aggregation)(unit_mask, total_units, total_rows, max_units)

        total = adv.total_reward
        metrics.update({
            "reward_mean": float(torch.nanmean(total)),
            "reward_std": float(total[~total.isnan()].std()) if (~total.isnan()).sum() > 1 else 0.0,
            **{f"reward/{k}": float(torch.nanmean(v)) for k, v in rewards.items()},
            **adv.stats,
        })
        lengths = [x for c in counts for x in c.lengths]
        truncated = [x for c in counts for x in c.truncated]
        metrics["completion_length"] = sum(lengths) / max(len(lengths), 1)
        if truncated:
            metrics["truncated_frac"] = sum(truncated) / len(truncated)
        return StepBatch(local, advantages, row_mask, weights, metrics)

    def _micro_batches(self, batch: StepBatch) -> list[Tensor]:
        """Row indices of each micro-batch. Rows without gradient (zero advantage, and no active
        regulariser that needs every row) are skipped; every process runs the same number of micro-batches (padded
        with empty ones) so gradient synchronisation lines up."""
        algo = self.cfg.algorithm
        needs_every_row = regulariser_needs(algo, "all_rows")
        active = batch.row_mask.clone()
        if not needs_every_row:
            active &= row_magnitude(batch.advantages) > 0
        rows = active.nonzero().flatten()
        size = self.cfg.optim.micro_batch_size
        chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
        counts: list[MicroBatchCounts] = self._gather(MicroBatchCounts(len(chunks), int(active.sum()),
                                                                       int(batch.row_mask.sum())))
        most = max(c.chunks for c in counts)
        chunks += [rows[:0]] * (most - len(chunks))
        batch.metrics["skipped_frac"] = 1.0 - sum(c.active for c in counts) / max(sum(c.rows for c in counts), 1)
        return chunks

    def _unit_slices(self, mb: Rollout) -> list[tuple[slice, list[slice] | None]]:
        algo = self.cfg.algorithm
        if algo.ratio_level == "sequence" or regulariser_needs(algo, "whole_rows"):
            return [(slice(None), None)]
        if algo.ratio_level == "chunk":
            segs = ratio_segments("chunk", mb.num_units, algo.chunks)
            return [(s, [slice(0, s.stop - s.start)]) for s in segs]
        return [(s, None) for s in self.policy.unit_slices(mb)]

    @torch.no_grad()
    def _no_grad_logprobs(self, batch: StepBatch, chunks: list[Tensor], reference: bool) -> Tensor:
        """Old (or reference) log-probs of every row, in the same micro-batch layout as training,
        so that the on-policy ratio of the first pass is exactly 1."""
        local = batch.rollout
        out = torch.zeros_like(local.unit_mask)
        source = local if len(local) else self._idle_row
        with self._gathered(self.reference if reference and self.reference is not None else self.model):
            for rows in chunks:
                padding = len(rows) == 0 or len(local) == 0  # a pass at zero, only to keep the processes in step
                if padding and not self._forwards_in_step:
                    continue
                mb = source.select(rows if not padding else [0])
                for units, _ in self._unit_slices(mb):
                    if reference:
                        with self._reference_model() as ref:
                            logp, _ = self.policy.logprobs(ref, mb, units)
                    else:
                        logp, _ = self.policy.logprobs(self.model, mb, units)
                    if not padding:
                        out[rows.unsqueeze(1), torch.arange(out.shape[1])[units].unsqueeze(0)] = logp.float().cpu()
        return out

    def accumulate_gradients(self, batch: StepBatch, chunks: list[Tensor], old_logp: Tensor | None,
                             ref_logp: Tensor | None, with_entropy: bool) -> dict[str, float]:
        """One pass over the micro-batches: forward, loss, backward, free; gradients accumulate
        into `.grad` and are synchronised across processes on the last backward."""
        acc, algo = self.accelerator, self.cfg.algorithm
        local, world = batch.rollout, acc.num_processes
        sums = {"loss": 0.0, "units": 0.0, "clipped": 0.0, "ratio_max_dev": 0.0,
                **{k: 0.0 for k in metric_names()}}
        if local.rollout_logp is not None:  # the rollout-vs-training gap is measured (mmrl/rollout_correction.py)
            add_sums(sums, {"rollout_units": 0.0, "rollout_diff_sum": 0.0, "rollout_capped": 0.0,
                            "rollout_diff_max": 0.0})
        elif algo.rollout_correction != "none" and len(local):
            raise UserError(f"algorithm.rollout_correction={algo.rollout_correction!r} needs the rollout sampler's "
                             f"log-probs, and the {self.cfg.task!r} adapter's rollouts under this policy section "
                             "record none (Rollout.rollout_logp); set algorithm.rollout_correction: none")
        if len(local) == 0 and not self.sharded:  # this process kept no rows: synchronise at zero
            acc.backward(sum(p.sum() for p in self.model.parameters() if p.requires_grad) * 0.0)
            return sums
        idle = len(local) == 0  # sharded: as many forward and backward passes as the others, at zero
        source = self._idle_row if idle else local
        work = [(rows, units, segs) for rows in chunks
                for units, segs in self._unit_slices(source.select(rows if len(rows) else [0]))]
        for k, (rows, units, segs) in enumerate(work):
            empty = len(rows) == 0  # padding so every process runs as many backward passes
            idx = rows if not empty else torch.tensor([0])
            mb = source.select(idx)
            last = k == len(work) - 1
            if idle:
                logp, _ = self.policy.logprobs(self.model, mb, units)
                self._backward(logp.sum() * 0.0, last)
                continue
            # DDP: synchronise on the last backward only; FSDP reduce-scatters each one (sharded gradients)
            sync = last or world == 1 or self.sharded
            with nullcontext() if sync else acc.no_sync(self.model):
                want_entropy = with_entropy or regulariser_needs(algo, "entropy")
                kl = None
                if self._closed_form_kl:
                    logp, entropy, kl = self.policy.logprobs_and_kl(self.model, self._reference_model, mb, units,
                                                                    with_entropy=want_entropy)
                else:
                    logp, entropy = self.policy.logprobs(self.model, mb, units, with_entropy=want_entropy)
                device = logp.device
                adv = batch.advantages[idx]
                old = old_logp[idx][:, units].to(device) if old_logp is not None else logp.detach()
                mask = mb.unit_mask[:, units].to(device) * batch.row_mask[idx, None].to(device)
                is_weight = capped = None
                if mb.rollout_logp is not None:
                    rollout_logp = mb.rollout_logp[:, units].to(device)
                    if algo.rollout_correction != "none":
                        is_weight, capped = importance_weights(old, rollout_logp, algo.rollout_correction,
                                                               algo.rollout_correction_cap)
                    if not empty:
                        add_sums(sums, mismatch_sums(old, rollout_logp, mask, capped))
                terms = self.objective.loss(
                    logp, old, (adv[:, units] if adv.dim() == 2 else adv).to(device), mask,
                    batch.weights[idx][:, units].to(device), algo, segments=segs,
                    ref_logp=ref_logp[idx][:, units].to(device) if ref_logp is not None else None,
                    entropy=entropy, kl=kl, **({"is_weight": is_weight} if is_weight is not None else {}))
                self._backward(terms.loss * (0.0 if empty else float(world)), last)
            if not empty:
                for key in ("units", "clipped"):
                    sums[key] += getattr(terms, key)
                for key, value in terms.metrics.items():
                    sums[key] += value
                sums["loss"] += terms.loss.item()
                sums["ratio_max_dev"] = max(sums["ratio_max_dev"], terms.ratio_max_dev)
        return sums

    def _backward(self, loss: Tensor, last: bool) -> None:
        """Backward of one micro-batch (`last`: the step's last one)."""
        if self.zero3:  # DeepSpeed's engine accumulates; the trainer steps it after its checks
            zero.backward(self.model, loss, last)
        else:
            self.accelerator.backward(loss)

    def _update(self, batch: StepBatch) -> dict[str, float]:
        """`mu` optimizer steps on the batch, old log-probs kept from before the first. A policy
        whose log-probs are redrawn each pass (`Policy.pass_view`) gets the old and reference
        log-probs of every pass from that pass's own view, all before the first step."""
        acc, algo = self.accelerator, self.cfg.algorithm
        chunks = self._micro_batches(batch)
        views = [self.policy.pass_view(batch.rollout, k) for k in range(algo.mu)]
        passes = [batch if view is None else replace(batch, rollout=view) for view in views]
        redrawn = any(view is not None for view in views)

        def per_pass(reference: bool) -> list[Tensor]:
            if not redrawn:
                return [self._no_grad_logprobs(batch, chunks, reference)] * algo.mu
            return [self._no_grad_logprobs(p, chunks, reference) for p in passes]

        keep_old = algo.mu > 1 and self.objective.uses_ratio
        old_logp = per_pass(reference=False) if keep_old else [None] * algo.mu
        ref_logp = per_pass(reference=True) if reference_pass(algo) else [None] * algo.mu
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm, first = 0.0, None
        self.nonfinite_term = None
        for pass_index in range(algo.mu):
            sums = self.accumulate_gradients(passes[pass_index], chunks, old_logp[pass_index], ref_logp[pass_index],
                                             with_entropy=pass_index == 0)
            first = first or sums
            self.nonfinite_term = self._nonfinite_term(sums["loss"], params)
            if self.zero3:  # DeepSpeed clips (optim.max_grad_norm) and steps; a skipped step drops the gradients
                if self.nonfinite_term is not None:
                    zero.drop_gradients(self.model)
                    grad_norm = math.nan
                    break
                grad_norm = zero.step(self.model)
                continue
            for p in params:  # a parameter with no gradient still takes an optimizer step at zero
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            if self.nonfinite_term is not None:  # skip this optimizer step (and the step's later passes)
                self.optimizer.zero_grad(set_to_none=False)
                grad_norm = math.nan
                break
            if self.cfg.optim.max_grad_norm is not None:
                grad_norm = float(acc.clip_grad_norm_(params, self.cfg.optim.max_grad_norm))
            self.optimizer.step()
            # sharded: free the gradient shards until the next backward (rollouts need no gradients)
            self.optimizer.zero_grad(set_to_none=self.sharding is not None)
        self.scheduler.step()
        gathered = self._gather(first)
        total = {k: sum(g.get(k, 0.0) for g in gathered) for k in first}
        units = total["units"] or math.nan  # nan: every row was skipped, nothing was measured
        regularisers = {logged: total[key] / units if per_unit else total[key]
                        for key, (logged, per_unit) in metric_names().items()}
        return {"loss": total["loss"], "clip_frac": total["clipped"] / units, **regularisers,
                "ratio_max_dev": max(g["ratio_max_dev"] for g in gathered), "grad_norm": grad_norm,
                "lr": self.scheduler.get_last_lr()[0], "nonfinite_skipped": float(self.nonfinite_term is not None),
                **mismatch_metrics(gathered, algo.rollout_correction)}

    def _nonfinite_term(self, loss: float, params: list[Tensor]) -> str | None:
        """'loss' or 'gradient norm' if either is NaN/inf on any process, else None (all agree)."""
        term = None
        if not math.isfinite(loss):
            term = "loss"
        elif not (zero.gradients_finite(self.model) if self.zero3 else
                  all(bool(torch.isfinite(local_tensor(p.grad)).all()) for p in params if p.grad is not None)):
            term = "gradient norm"
        return next((t for t in self._gather(term) if t is not None), None)

    def _enter_stage(self, stage: Stage) -> None:
        """Take `stage`'s settings before its first step (mmrl/stages.py); the model, the optimizer
        state and, when the stage keeps the data and sampling settings, the data position carry on."""
        if stage.index == self.stage.index:
            return
        old, new = self.cfg, stage.config
        if new.policy != old.policy:
            typed = from_dict(type(self.policy).Config, new.policy, "policy")
            changed = {k for k in {*old.policy, *new.policy} if old.policy.get(k, _UNSET) != new.policy.get(k, _UNSET)}
            self.policy.apply_stage_settings({k: getattr(typed, k) for k in changed})
        if new.rewards != old.rewards:
            self.reward_fns = {name: bind_reward(name, spec.args, spec.columns) for name, spec in new.rewards.items()}
            self.reward_weights = {name: spec.weight for name, spec in new.rewards.items()}
        if not self.plan.same_data(self.stage, stage):
            self.train_rows, self.eval_rows = load_validated_data(new, self.reward_fns)
            self.policy.prompt_column = new.data.prompt_column
            self.sampler = PromptSampler(self.train_rows, new.sampling, self.plan.sampler_seed(stage))
        if new.optim.lr != old.optim.lr:  # keeps the schedule's factor, on the new base rate
            for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
                group["lr"] = group["lr"] * new.optim.lr / base if base else new.optim.lr
                group["initial_lr"] = new.optim.lr
            self.scheduler.base_lrs = [new.optim.lr] * len(self.scheduler.base_lrs)
        self.cfg, self.stage = new, stage

    def train_step(self) -> dict[str, float]:
        step = self.step + 1
        self._enter_stage(self.plan.stage_at(step))
        t0 = time.perf_counter()
        self.policy.set_training_step(step)
        batch = self.prepare_batch(step)
        t1 = time.perf_counter()
        update = self._update(batch)
        metrics = {**batch.metrics, **update}
        if self.plan.staged:
            metrics["stage"] = self.stage.index
        metrics["time_rollout_s"] = t1 - t0
        metrics["time_update_s"] = time.perf_counter() - t1
        self.step = step
        return metrics

    # ----- loop -------------------------------------------------------------------------------
    def train(self) -> None:
        cfg, acc = self.cfg, self.accelerator
        metrics_file = self.output_dir / "metrics.jsonl"
        if not self.resumed and acc.is_main_process and metrics_file.exists():
            metrics_file.unlink()  # a fresh run in a used directory starts a fresh record
        self.tracker = Tracker(self.output_dir, cfg.logging.report_to, cfg.logging.plot_every,
                               config=to_dict(self.plan.recipe), resume_step=self.step if self.resumed else None,
                               enabled=acc.is_main_process)
        progress = Progress(cfg.max_steps, initial=self.step,
                            enabled=cfg.logging.progress and acc.is_main_process)
        try:
            with StopSignals() as stop:
                while self.step < cfg.max_steps:
                    metrics = self.train_step()
                    every = self.cfg.eval.every  # the stage's
                    if every and self.step % every == 0 and self.eval_rows:
                        scores = self.evaluate()
                        self.last_eval = (self.step, scores["reward_mean"])
                        metrics.update({f"eval/{k}": v for k, v in scores.items()})
                    self.bad_steps = self.bad_steps + 1 if self.nonfinite_term else 0
                    self.tracker.log(self.step, metrics)
                    progress.update(self.step, metrics)
                    saved = cfg.save_every and self.step % cfg.save_every == 0
                    if saved:
                        self.save_checkpoint()
                    if self.bad_steps >= cfg.max_bad_steps:
                        path = self.save_checkpoint()
                        raise NonFiniteError(
                            f"step {self.step}: the {self.nonfinite_term} was not finite for {self.bad_steps} "
                            f"steps in a row (max_bad_steps={cfg.max_bad_steps}), so the run stopped; checkpoint "
                            f"{path}. Lower optim.lr or set optim.max_grad_norm, then resume=true")
                    if any(self._gather(stop.received is not None)):
                        path = ckpt.checkpoint_dir(self.output_dir, self.step) if saved else self.save_checkpoint()
                        raise RunInterrupted(f"stopped by {stop.name} after step {self.step}; checkpoint {path}; "
                                             "continue with the same command and resume=true", stop.received or 15)
            if not cfg.save_every or self.step % cfg.save_every:
                self.save_checkpoint()
        finally:
            progress.close()
            self.tracker.close()

    def evaluate(self, rows: list[dict] | None = None, evaluator=None, keep_samples: bool = False) -> dict:
        """Held-out scores (`mmrl.evaluate.evaluate`), with `evaluator`'s beside the reward's."""
        cfg = self.cfg
        rows = (rows if rows is not None else self.eval_rows)[: cfg.eval.max_prompts]
        with self._rollout_params():
            return evaluate(self.policy, rows, self.reward_fns, self.reward_weights,
                            cfg.eval.group_size, cfg.seed, combine=cfg.algorithm.reward_combine,
                            gates=cfg.algorithm.gates, evaluator=evaluator, keep_samples=keep_samples)

    def warm_start(self) -> float:
        """Supervised warm start (`warm_start.*`) of the policy on the data set's targets."""
        ws = self.cfg.warm_start
        if ws.steps <= 0:
            return math.nan
        model = self.unwrapped
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=ws.lr)
        from transformers import get_scheduler
        scheduler = get_scheduler("cosine" if ws.schedule == "cosine" else "constant_with_warmup", optimizer,
                                  num_warmup_steps=ws.warmup_steps, num_training_steps=ws.steps)
        generator = torch.Generator().manual_seed(derive_seed(self.cfg.seed, 0xA11CE))
        loss = torch.zeros(())
        progress = Progress(ws.steps, enabled=self.cfg.logging.progress and self.accelerator.is_main_process,
                            desc="warm start")
        for step in range(1, ws.steps + 1):
            pick = torch.randint(len(self.train_rows), (ws.batch_size,), generator=generator).tolist()
            loss = self.policy.supervised_loss(model, [self.train_rows[i] for i in pick], ws.target_column)
            loss.backward()
            if ws.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, ws.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.update(step, {"loss": loss.item()})
        progress.close()
        return loss.item()

    # ----- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        acc = self.accelerator
        final = ckpt.checkpoint_dir(self.output_dir, self.step)
        tmp = ckpt.temporary_dir(self.output_dir, self.step)
        if acc.is_main_process and tmp.exists():
            shutil.rmtree(tmp)
        acc.wait_for_everyone()
        acc.save_state(str(tmp), safe_serialization=True)  # under fsdp: the scheduler and RNG states only
        if self.sharding is not None:
            self.sharding.save(self.model, self.optimizer, tmp / SHARDS_DIR)
            full = self.sharding.full_state_dict(self.model, self.sharding.compute_dtype)
            if acc.is_main_process:
                with self.sharding.plain_classes(self.model):
                    self.policy.save_pretrained(self.model, tmp / "model", state_dict=full)
        elif self.zero3:  # every process takes part in gathering the weights
            full = acc.get_state_dict(self.model)
            if acc.is_main_process:
                self.policy.save_pretrained(self.unwrapped, tmp / "model", state_dict=full)
        elif acc.is_main_process:
            self.policy.save_pretrained(self.unwrapped, tmp / "model")
        if acc.is_main_process:
            state = {"step": self.step, "sampler": self.sampler.state_dict(), "bad_steps": self.bad_steps}
            if self.last_eval is not None and self.last_eval[0] == self.step:
                state["eval_reward_mean"] = self.last_eval[1]
            ckpt.publish(tmp, final, state)
            if self.cfg.save_total_limit is not None:
                ckpt.prune(self.output_dir, self.cfg.save_total_limit, self.cfg.eval.keep_best)
        acc.wait_for_everyone()
        return final

    def load_checkpoint(self, path: Path) -> None:
        self.accelerator.load_state(str(path))
        if self.sharding is not None:
            self.sharding.load(self.model, self.optimizer, path / SHARDS_DIR)
        state = ckpt.read_trainer_state(path)
        self.step = int(state["step"])
        self._enter_stage(self.plan.stage_at(self.step))  # the checkpoint's data and settings
        self.bad_steps = int(state.get("bad_steps", 0))
        self.sampler.load_state_dict(state["sampler"])
