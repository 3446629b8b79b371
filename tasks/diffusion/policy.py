"""Diffusion and flow-matching text-to-image and text/image-to-video models as policies over
denoising steps (families: `families.py`, `video_families.py`).

The unit is one step x_k -> x_{k+1}; its log-prob is the Gaussian log density of the sampler's
step (`samplers.py`), fp32, mean over latent dims. A group shares one initial noise (DanceGRPO)
drawn from the group's seed; each rollout then draws its step noise from its own generator, so a
group depends on its prompt and seed only. Which steps are stochastic and trained is
`policy.schedule` (`schedule.py`). `unit_slices` gives one slice per trained step, so the engine
backpropagates step by step and memory does not grow with the number of steps; a step is forwarded
(policy and reference) on the rows of the micro-batch whose `unit_mask` trains it only, its value 0
on the others (masked out by every consumer).

Rollout extras: `latents` [N, U + 1, ...] (the trajectory: step k goes from latents[:, k] to
latents[:, k + 1]), `levels` [N, U + 1] (sigmas or cumulative alphas), `timesteps` [N, U],
`stochastic` [N, U] (the steps each rollout took by SDE; a `random_window` differs per group),
and the prompt conditioning (`pos/...`, `neg/...` when CFG is on), all on
the CPU; a step's tensors move to the device when that step of a micro-batch is scored. The
step log-probs as sampled are `Rollout.rollout_logp` (0 at deterministic steps).

With `policy.branching` (BranchGRPO, `branching.py`) a group is a tree: its rows share their
latents up to the depth where their node splits, the denoiser runs once per node (on its first
row) and a node's rows take its first row's step noise; each edge is a trained unit of that first
row only, and `unit_rewards` gives each unit its node's reward.

With `policy.units: forward_process` (DiffusionNFT, `forward_process.py`) a unit is instead a
(final sample, noise level) pair: unit k re-noises the final sample at level k with noise drawn
from the row's seed and k. Rollout extras then hold `clean` [N, ...] (the final samples),
`levels`, `timesteps`, `noise_seeds` [N] and the conditioning; no trajectory, no sampler log-probs.
Each of its rollouts starts from noise of its own (a deterministic sampler would otherwise give a
group of equal samples).
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout
from mmrl.core.seeding import derive_seed
from mmrl.data.images import rgb_image
from mmrl.registry import ADAPTERS

from ..model_loading import DTYPES
from . import grpo_guard
from .branching import edge_owners, first_rows, node_rewards, pruned_units, representatives
from .config import DiffusionConfig
from .family import Family, family_of
from .forward_process import implicit_velocity_losses, renoised
from .loading import load_pipeline
from .media_columns import column_checks, completion_columns, prompt_conditioning
from .samplers import EPS_SAMPLERS, KL_FORMS, LOGPROB_FORMS, SAMPLERS, flow_grpo_kl_factor, gaussian_mean_kl
from .turning_point import TurningPointRewards

NOISE_SALT, STEPS_SALT, FORWARD_SALT, WINDOW_SALT = 0x5DE, 0x57E, 0xF0D, 0x3D0


@dataclass
class StepTerms:
    """Per trained step of a batch, in step order: log-probs [B], constant entropies, detached
    means [B, ...], KLs to the reference [B] and divergences from the old means [B]."""

    logps: list[Tensor] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    means: list[Tensor] = field(default_factory=list)
    kls: list[Tensor] = field(default_factory=list)
    divergences: list[Tensor] = field(default_factory=list)

    def logp(self) -> Tensor:
        return torch.stack(self.logps, 1)

    def entropy(self) -> Tensor:
        logp = self.logp()
        return torch.tensor(self.entropies, device=logp.device).expand_as(logp)

    @staticmethod
    def stacked(values: list[Tensor]) -> Tensor | None:
        """[B, u, ...] of the steps' values, or None where none was computed."""
        return torch.stack(values, 1) if values else None


@ADAPTERS.register("diffusion")
class DiffusionPolicy(TurningPointRewards):
    runs_in_rollout_worker = True

    @classmethod
    def rollout_worker_problem(cls, policy: dict) -> str | None:
        if policy.get("units", "steps") == "forward_process":
            return "policy.units=forward_process (no behaviour log-probs to correct stale rows with)"
        return None

    Config = DiffusionConfig

    def __init__(self, cfg: DiffusionConfig, pipe=None):
        if not cfg.model and pipe is None:
            raise ValueError("policy.model must name a diffusers pipeline (hub id, local path, or tiny:NAME)")
        if cfg.dtype not in DTYPES:
            raise ValueError(f"policy.dtype={cfg.dtype!r} is not one of {sorted(DTYPES)}")
        SAMPLERS.get(cfg.sampler)
        if cfg.kl_form not in KL_FORMS:
            raise ValueError(f"policy.kl_form={cfg.kl_form!r} is not one of {KL_FORMS}")
        if cfg.kl_form == "flow_grpo":
            flow_grpo_kl_factor(cfg.sampler, 1.0, 0.5)  # raises for a sampler Flow-GRPO has no KL for
        if cfg.cps_logprob not in LOGPROB_FORMS:
            raise ValueError(f"policy.cps_logprob={cfg.cps_logprob!r} is not one of {sorted(LOGPROB_FORMS)}")
        if cfg.cps_logprob != "gaussian" and cfg.sampler != "cps":
            raise ValueError(f"policy.cps_logprob={cfg.cps_logprob!r} is the CPS sampler's; policy.sampler is {cfg.sampler!r}")
        if cfg.tp_consistent_steps not in ("all", "first"):
            raise ValueError(f"policy.tp_consistent_steps={cfg.tp_consistent_steps!r} is not one of ('all', 'first')")
        if cfg.units not in ("steps", "forward_process"):
            raise ValueError(f"policy.units={cfg.units!r} is not one of ('steps', 'forward_process')")
        if cfg.units == "forward_process" and cfg.classifier_free_guidance:
            raise ValueError("policy.units=forward_process trains the CFG-free model (DiffusionNFT): set "
                             "policy.classifier_free_guidance=false")
        if not 0 < cfg.forward_fraction <= 1 or int(cfg.num_steps * cfg.forward_fraction) < 1:
            raise ValueError(f"policy.forward_fraction={cfg.forward_fraction} must be in (0, 1] and keep at least "
                             f"one of the {cfg.num_steps} noise levels")
        problems = self.config_problems(cfg)
        if problems:
            raise ValueError("; ".join(problems))
        if cfg.num_steps < 2 or cfg.eval_num_steps < 1:
            raise ValueError(f"policy.num_steps={cfg.num_steps} must be >= 2 (the last step is never trained)")
        self.cfg = cfg
        self.pipe = pipe if pipe is not None else load_pipeline(cfg)
        self.family: Family = family_of(self.pipe, (cfg.height, cfg.width), cfg.num_frames)
        self.family.check_settings(cfg)
        if cfg.flow_shift is not None:
            self.family.set_flow_shift(cfg.flow_shift)
        if (cfg.sampler in EPS_SAMPLERS) != (self.family.kind == "eps"):
            raise ValueError(f"policy.sampler={cfg.sampler!r} does not fit a {type(self.family).__name__} "
                             f"model ({'ddim' if self.family.kind == 'eps' else 'flow_sde, dance, cps or ode'})")
        if cfg.turning_points and cfg.schedule.kind == "random_window":
            raise ValueError("policy.turning_points needs one window for the whole batch; policy.schedule.kind="
                             "random_window draws one per group (use window or sliding_window)")
        if cfg.units == "forward_process" and self.family.kind != "flow":
            raise ValueError(f"policy.units=forward_process re-noises samples on the flow-matching forward process; "
                             f"a {type(self.family).__name__} model predicts eps (use a flow model)")
        if cfg.classifier_free_guidance and not self.family.uses_classifier_free_guidance:
            raise ValueError(f"policy.classifier_free_guidance=true: {type(self.family).__name__} takes guidance as an "
                             "embedding; set policy.classifier_free_guidance=false")
        for module in self.pipe.components.values():
            if isinstance(module, nn.Module):
                module.requires_grad_(False).eval()
        self.model = self.family.denoiser
        self.model.requires_grad_(True)
        if cfg.gradient_checkpointing:  # recompute the denoiser's activations in backward
            self.model.enable_gradient_checkpointing()
        if cfg.vae_tiling:
            self.pipe.vae.enable_tiling()
        if cfg.device:
            self.pipe.to(cfg.device)
        self.training_step = 0
        self._counts: dict[str, float] = {}

    @classmethod
    def media_columns(cls, cfg: DiffusionConfig) -> dict[str, Callable[[Any], None]]:
        return column_checks(cfg)

    # ----- the contract ------------------------------------------------------------------------
    @classmethod
    def config_problems(cls, cfg: DiffusionConfig) -> list[str]:
        problems = cfg.branching.problems(cfg.num_steps)
        if cfg.branching.on and (cfg.turning_points or cfg.units != "steps"):
            problems.append("policy.branching: a tree of rollouts is trained by its steps; it does not go with "
                            "policy.turning_points or policy.units=forward_process")
        return problems

    @classmethod
    def group_size_problems(cls, cfg: DiffusionConfig, group_size: int) -> list[str]:
        return cfg.branching.group_size_problems(group_size)

    @classmethod
    def unit_terms(cls, cfg: DiffusionConfig) -> str:
        return "implicit_velocity" if cfg.units == "forward_process" else "logprobs"

    @property
    def max_units(self) -> int:
        return self.cfg.num_steps

    def set_training_step(self, step: int) -> None:
        self.training_step = step

    def unit_slices(self, batch: Rollout) -> list[slice]:
        trained = batch.unit_mask.bool().any(0).nonzero().flatten().tolist()
        return [slice(k, k + 1) for k in trained]

    def _sync_devices(self) -> None:
        """Frozen components follow the denoiser (the engine moves only `model`)."""
        device = self.device
        for module in self.pipe.components.values():
            if isinstance(module, nn.Module) and module is not self.family.denoiser:
                if next(module.parameters(), torch.empty(0, device=device)).device != device:
                    module.to(device)

    @torch.no_grad()
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int],
                greedy: bool = False) -> Rollout:
        cfg = self.cfg
        self._sync_devices()
        texts = [str(self.prompt_of(p)) for p in prompts]
        n = len(texts) * group_size
        steps = cfg.eval_num_steps if greedy else cfg.num_steps
        sampler = self.family.deterministic_sampler if greedy else cfg.sampler
        strength = 0.0 if greedy else cfg.noise_level
        device = self.device
        cond = prompt_conditioning(self.family, cfg, prompts, texts, group_size)
        row_seeds = [derive_seed(s, NOISE_SALT, j) for s in seeds for j in range(group_size)]
        if cfg.units == "forward_process" and not greedy:  # DiffusionNFT: every sample from its own noise
            x = torch.cat([self._group_noise(derive_seed(r, FORWARD_SALT), 1) for r in row_seeds]).to(device)
        else:
            x = torch.cat([self._group_noise(s, group_size) for s in seeds]).to(device)
        levels, timesteps = self.family.levels(steps, tuple(x.shape))
        noise_gens = [torch.Generator().manual_seed(r) for r in row_seeds]
        stochastic = self._stochastic_rows(seeds, group_size, steps, greedy)
        trained = torch.stack([cfg.schedule.trained(steps, self.training_step,
                                                    torch.Generator().manual_seed(derive_seed(r, STEPS_SALT)))
                               for r in row_seeds]) & stochastic if not greedy else torch.zeros(n, steps, dtype=torch.bool)
        step_fn = SAMPLERS.get(sampler)
        tree = cfg.branching if cfg.branching.on and not greedy else None
        widths = self._tree_widths(tree, group_size, steps, stochastic)
        trajectory = [x.float().cpu()]
        logps = torch.zeros(n, steps)
        noisy = torch.zeros(n, steps, dtype=torch.bool)
        for k in range(steps):
            # the denoiser runs once per node: on its first row, the rows under it taking the result
            reps, index = representatives(first_rows(group_size, len(texts), widths[k]))
            at_nodes = x[reps].float() if widths[k] < group_size else x.float()
            node_cond = {key: v[reps] for key, v in cond.items()} if widths[k] < group_size else cond
            pred = self.family.predict(self.model, at_nodes, timesteps[k], node_cond, cfg.guidance_scale,
                                       cfg.classifier_free_guidance).float()
            rows = stochastic[:, k].nonzero().flatten().tolist()
            mean, std = step_fn(at_nodes, pred, levels[k], levels[k + 1], strength if rows else 0.0)
            mean = mean[index]
            if std > 0:  # the SDE on this step's stochastic rows (each drawing its own noise), the ODE on the others
                noise = torch.zeros(n, *x.shape[1:])
                noise[rows] = torch.stack([torch.randn(x.shape[1:], generator=noise_gens[i]) for i in rows])
                # rows under one node after the step take that node's noise (its first row's)
                noise = noise[first_rows(group_size, len(texts), widths[k + 1])[rows]]
                scale = tree.noise_scale if tree is not None and k in tree.at else 1.0
                sde = mean[rows] + scale * std * noise.to(device)
                logps[rows, k] = self._logprob(sde, mean[rows], std).cpu()
                noisy[rows, k] = True
                x = mean if len(rows) == n else step_fn(at_nodes, pred, levels[k], levels[k + 1], 0.0)[0][index]
                x[rows] = sde  # (in place: `mean` is not used after this)
            else:
                x = mean
            if not greedy and cfg.units == "steps":
                trajectory.append(x.float().cpu())
        if tree is not None:  # each edge of the tree trained once, on its first row; pruned depths not at all
            trained &= edge_owners(tree, group_size, len(texts), steps)
            trained &= ~pruned_units(tree, self.training_step, steps)
        trained &= noisy  # a step that drew no noise (strength 0) has no log-prob
        images = self._decode(x)
        extras: dict[str, Any] = {}
        if not greedy and cfg.units == "forward_process":
            return self._forward_process_rollout(texts, group_size, images, x, levels, timesteps, cond, row_seeds)
        if not greedy:
            extras = {"latents": torch.stack(trajectory, 1),
                      "levels": torch.tensor(levels, dtype=torch.float64).expand(n, -1).clone(),
                      "timesteps": timesteps.float().expand(n, -1).clone(),
                      "stochastic": noisy,
                      **{k: v.cpu() for k, v in cond.items()}}
        return Rollout(group_id=torch.arange(len(texts)).repeat_interleave(group_size),
                       prompts=[t for t in texts for _ in range(group_size)], completions=images,
                       unit_mask=trained.float(), extras=extras, rollout_logp=None if greedy else logps,
                       columns=completion_columns(self.family, self.cfg, n))

    @staticmethod
    def _tree_widths(tree, group_size: int, steps: int, stochastic: Tensor) -> list[int]:
        """Nodes per group at depths 0 .. steps: the tree's (BranchGRPO), or one per row."""
        if tree is None:
            return [group_size] * (steps + 1)
        problems = tree.problems(steps) + tree.group_size_problems(group_size)
        if problems:
            raise ValueError("; ".join(problems))
        if not stochastic[:, tree.at].all():
            raise ValueError(f"policy.branching.at={tree.at}: every split step must be a stochastic (SDE) step of "
                             "every rollout under policy.schedule (a split at an ODE step would give equal children)")
        return tree.widths(steps)

    def unit_rewards(self, batch: Rollout, rewards: dict[str, Tensor]) -> dict[str, Tensor] | None:
        """BranchGRPO: each unit's reward is the mean over the leaves under its tree node, on the row
        that carries the edge, NaN on the rows sharing it (`branching.node_rewards`)."""
        tree = self.cfg.branching
        if not tree.on:
            return None
        group_size = tree.factor ** len(tree.at)
        return {name: node_rewards(v, tree, group_size, batch.num_units) for name, v in rewards.items()}

    def _forward_process_rollout(self, texts, group_size, images, x, levels, timesteps, cond, row_seeds) -> Rollout:
        """The rollout of `policy.units: forward_process`: each row trains `forward_fraction` of the
        levels, drawn from its seed (DiffusionNFT)."""
        n, steps = len(row_seeds), len(timesteps)
        keep = int(steps * self.cfg.forward_fraction)
        units = torch.zeros(n, steps)
        for i, r in enumerate(row_seeds):
            units[i, torch.randperm(steps, generator=torch.Generator().manual_seed(derive_seed(r, STEPS_SALT)))[:keep]] = 1
        extras = {"clean": x.float().cpu(), "levels": torch.tensor(levels, dtype=torch.float64).expand(n, -1).clone(),
                  "timesteps": timesteps.float().expand(n, -1).clone(),
                  "noise_seeds": torch.tensor([derive_seed(r, FORWARD_SALT) for r in row_seeds]),
                  **{k: v.cpu() for k, v in cond.items()}}
        return Rollout(group_id=torch.arange(len(texts)).repeat_interleave(group_size),
                       prompts=[t for t in texts for _ in range(group_size)], completions=images,
                       unit_mask=units, extras=extras, columns=completion_columns(self.family, self.cfg, n))

    def _stochastic_rows(self, seeds: Sequence[int], group_size: int, steps: int, greedy: bool) -> Tensor:
        """bool [N, U]: the steps each rollout samples by SDE (a random_window is drawn per group)."""
        schedule, n = self.cfg.schedule, len(seeds) * group_size
        if greedy:
            return torch.zeros(n, steps, dtype=torch.bool)
        if schedule.kind != "random_window":
            return schedule.stochastic(steps, self.training_step).expand(n, -1).clone()
        return torch.stack([schedule.stochastic(steps, self.training_step,
                                                torch.Generator().manual_seed(derive_seed(s, WINDOW_SALT)))
                            for s in seeds]).repeat_interleave(group_size, 0)

    @classmethod
    def step_scale_problem(cls, cfg: DiffusionConfig) -> str | None:
        return grpo_guard.step_scale_problem(cfg)

    def step_scales(self, batch: Rollout, units: slice) -> tuple[Tensor, Tensor]:
        """GRPO-Guard's (step std, 1 / |dt|) [B, u] (`grpo_guard.py`)."""
        return grpo_guard.step_scales(batch, units, self.cfg.sampler, self.cfg.noise_level)

    def _group_noise(self, seed: int, group_size: int) -> Tensor:
        noise = self.family.noise(torch.Generator().manual_seed(int(seed)), self.cfg.height, self.cfg.width)
        return noise.expand(group_size, *noise.shape[1:])

    def _decode(self, x: Tensor) -> list:
        out = []
        for i in range(0, len(x), self.cfg.decode_batch):
            out += self.family.decode(x[i:i + self.cfg.decode_batch].to(self.family.dtype), self.cfg.height, self.cfg.width)
        return out

    def _step_means(self, model: nn.Module, batch: Rollout, k: int, rows: Tensor) -> tuple[Tensor, float]:
        """(mean of step k under `model` [r, ...], the step's std) for rows `rows` of a batch of rollouts."""
        ex, device = batch.extras, self.device
        x = ex["latents"][rows, k].to(device)
        levels = ex["levels"][0].tolist()
        cond = {key: v[rows].to(device) for key, v in ex.items() if key.startswith(("pos/", "neg/"))}
        pred = self.family.predict(model, x, ex["timesteps"][0, k], cond, self.cfg.guidance_scale, self.cfg.classifier_free_guidance)
        # rows that took the ODE at step k are never trained there: their SDE mean is masked out
        strength = self.cfg.noise_level if bool(ex["stochastic"][rows, k].any()) else 0.0
        return SAMPLERS.get(self.cfg.sampler)(x.float(), pred.float(), levels[k], levels[k + 1], strength)

    def _unit_rows(self, model: nn.Module, batch: Rollout, units: slice) -> list[tuple[int, Tensor]]:
        """(unit k, the rows whose `unit_mask` trains k) for each unit of `units`: the training forward
        of a unit takes those rows only. A unit no row trains takes none, except the first unit where
        none of them is trained (the backward needs a graph) and every unit where `model` is sharded
        (every process runs as many forwards): there the first row, its value masked out."""
        ks = list(range(batch.num_units))[units]
        rows = [batch.unit_mask[:, k].nonzero().flatten() for k in ks]
        first = torch.tensor([0])
        if self.parallel.is_sharded(model):
            rows = [r if len(r) else first for r in rows]
        elif ks and not any(len(r) for r in rows):
            rows[0] = first
        return list(zip(ks, rows))

    def _on_rows(self, values: Tensor, rows: Tensor, n: int) -> Tensor:
        """[n, ...]: `values` [r, ...] at `rows`, 0 at the rows that do not train the unit (every
        consumer masks them: the loss, the KL, the ratio, the rollout correction, the metrics)."""
        if len(rows) == n:  # the rows are sorted: every row
            return values
        return values.new_zeros(n, *values.shape[1:]).index_copy(0, rows.to(values.device), values)

    def _untrained(self, n: int, *shape: int) -> Tensor:
        """[n, *shape] zeros: a unit no row of the micro-batch trains (never forwarded)."""
        return torch.zeros(n, *shape, device=self.device)

    def _logprob(self, sample: Tensor, mean: Tensor, std: float) -> Tensor:
        """The step's log-prob in the configured form (`policy.cps_logprob`)."""
        return LOGPROB_FORMS[self.cfg.cps_logprob](sample, mean, std)

    def _kl(self, mean: Tensor, ref_mean: Tensor, std: float, batch: Rollout, k: int) -> Tensor:
        """The step's closed-form KL, exact or in Flow-GRPO's form (`policy.kl_form`)."""
        kl = gaussian_mean_kl(mean, ref_mean, std)
        if self.cfg.kl_form == "flow_grpo":
            levels = batch.extras["levels"][0]
            kl = kl * flow_grpo_kl_factor(self.cfg.sampler, float(levels[k]), float(levels[k + 1]))
        return kl

    def _units(self, model: nn.Module, batch: Rollout, units: slice, with_entropy: bool,
               reference: Callable[[], AbstractContextManager[nn.Module]] | None = None,
               old_means: Tensor | None = None, keep_means: bool = False) -> StepTerms:
        """The terms of each unit, computed on the rows that train it (`_unit_rows`), 0 elsewhere."""
        terms, n = StepTerms(), len(batch)
        for j, (k, rows) in enumerate(self._unit_rows(model, batch, units)):
            if not len(rows):
                self._add_untrained(terms, batch, keep_means, reference is not None, old_means is not None)
                continue
            mean, std = self._step_means(model, batch, k, rows)
            if std > 0:
                logp = self._logprob(batch.extras["latents"][rows, k + 1].to(mean.device), mean, std)
            else:  # an ODE step is never a trained unit: a constant 0 that keeps the graph
                logp = mean.flatten(1)[:, 0] * 0.0
            terms.logps.append(self._on_rows(logp, rows, n))
            # a Gaussian with a fixed std has a constant entropy per dim: 0.5 log(2 pi e std^2)
            terms.entropies.append(0.5 * math.log(2 * math.pi * math.e * std ** 2) if std > 0 else 0.0)
            if keep_means:
                terms.means.append(self._on_rows(mean.detach(), rows, n))
            if reference is not None:
                with torch.no_grad(), reference() as ref:
                    ref_mean, _ = self._step_means(ref, batch, k, rows)
                kl = self._kl(mean, ref_mean, std, batch, k) if std > 0 else logp * 0.0
                terms.kls.append(self._on_rows(kl, rows, n))
            if old_means is not None:  # FlowDPPO's divergence: the exact KL whatever policy.kl_form says
                old = old_means[rows, j].to(mean.device)
                divergence = gaussian_mean_kl(old, mean, std) if std > 0 else logp * 0.0
                terms.divergences.append(self._on_rows(divergence, rows, n))
        return terms

    def _add_untrained(self, terms: StepTerms, batch: Rollout, means: bool, kl: bool, divergence: bool) -> None:
        """The terms of a unit no row trains: zeros, no forward."""
        n = len(batch)
        terms.logps.append(self._untrained(n))
        terms.entropies.append(0.0)
        if means:
            terms.means.append(self._untrained(n, *batch.extras["latents"].shape[2:]))
        if kl:
            terms.kls.append(self._untrained(n))
        if divergence:
            terms.divergences.append(self._untrained(n))

    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """Step log-probs; under `units: forward_process` the flow-matching surrogate of each unit's
        log-likelihood, -mean_d (v_theta(x_t) - (eps - x0))^2 (no entropy)."""
        if self.cfg.units == "forward_process":
            scores = []
            for k, rows in self._unit_rows(model, batch, units):
                if not len(rows):
                    scores.append(self._untrained(len(batch)))
                    continue
                v, _, x0, eps, _ = self._forward_unit(model, batch, k, rows)
                scores.append(self._on_rows(-(v.float() - (eps - x0)).pow(2).flatten(1).mean(1), rows, len(batch)))
            return torch.stack(scores, 1), None
        terms = self._units(model, batch, units, with_entropy)
        return terms.logp(), terms.entropy() if with_entropy else None

    def _forward_unit(self, model: nn.Module, batch: Rollout, k: int, rows: Tensor):
        """Unit k of rows `rows`: (v_theta at x_t [r, ...], x_t, x0, eps, t) with x_t the final sample
        re-noised at level k by the noise of (row seed, k)."""
        ex, device = batch.extras, self.device
        x0 = ex["clean"][rows].to(device)
        eps = torch.stack([torch.randn(x0.shape[1:], generator=torch.Generator().manual_seed(derive_seed(int(s), k)))
                           for s in ex["noise_seeds"][rows]]).to(device)
        t = ex["levels"][rows, k].to(device=device, dtype=torch.float32)
        xt = renoised(x0, eps, t)
        v = self.family.predict(model, xt, ex["timesteps"][0, k], self._pos_cond(batch, rows), 1.0, False)
        return v, xt, x0, eps, t

    def implicit_velocity_losses(self, model: nn.Module, batch: Rollout, units: slice, beta: float,
                                 reference: Callable[[], AbstractContextManager[nn.Module]] | None = None
                                 ) -> tuple[Tensor, Tensor, Tensor | None]:
        """DiffusionNFT's (L+, L-) [B, u] (`forward_process.py`), the old velocity being `model`'s own,
        detached (the policy at the step's start: one update pass), and with `reference` the
        authors' KL, mean_d (v_theta - v_ref)^2; each unit computed on the rows that train it, 0 elsewhere."""
        positives, negatives, kls, n = [], [], [], len(batch)
        for k, rows in self._unit_rows(model, batch, units):
            if not len(rows):
                positives.append(self._untrained(n))
                negatives.append(self._untrained(n))
                if reference is not None:
                    kls.append(self._untrained(n))
                continue
            v, xt, x0, _, t = self._forward_unit(model, batch, k, rows)
            pos, neg = implicit_velocity_losses(v, v.detach(), xt, x0, t, beta)
            positives.append(self._on_rows(pos, rows, n))
            negatives.append(self._on_rows(neg, rows, n))
            if reference is not None:
                with torch.no_grad(), reference() as ref:
                    v_ref = self.family.predict(ref, xt, batch.extras["timesteps"][0, k], self._pos_cond(batch, rows),
                                                1.0, False)
                kls.append(self._on_rows((v.float() - v_ref.float()).pow(2).flatten(1).mean(1), rows, n))
        return torch.stack(positives, 1), torch.stack(negatives, 1), torch.stack(kls, 1) if kls else None

    def _pos_cond(self, batch: Rollout, rows: Tensor) -> dict[str, Tensor]:
        return {key: v[rows].to(self.device) for key, v in batch.extras.items() if key.startswith("pos/")}

    def logprobs_and_kl(self, model: nn.Module, reference: Callable[[], AbstractContextManager[nn.Module]],
                        batch: Rollout, units: slice = slice(None),
                        with_entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """Log-probs and the closed-form KL of each step to the reference (entered through
        `reference()`), ||mu_theta - mu_ref||^2 / (2 std^2), mean over latent dims (`policy.kl_form`:
        exact, or Flow-GRPO's, |dt| times that for flow_sde)."""
        terms = self._units(model, batch, units, with_entropy, reference)
        return terms.logp(), terms.entropy() if with_entropy else None, terms.stacked(terms.kls)

    @classmethod
    def divergence_problem(cls, cfg: DiffusionConfig) -> str | None:
        if cfg.units == "steps":
            return None
        return (f"FlowDPPO's divergence is that of the sampler's Gaussian steps (policy.units: steps), "
                f"not of policy.units={cfg.units!r}")

    def logprobs_and_means(self, model: nn.Module, batch: Rollout, units: slice = slice(None)) -> tuple[Tensor, Tensor]:
        """Step log-probs and the step means [B, u, ...] (fp32), kept as the old policy's for FlowDPPO."""
        terms = self._units(model, batch, units, with_entropy=False, keep_means=True)
        return terms.logp(), terms.stacked(terms.means)

    def logprobs_and_divergence(self, model: nn.Module, batch: Rollout, units: slice, old_means: Tensor,
                                reference: Callable[[], AbstractContextManager[nn.Module]] | None = None,
                                with_entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
        """Step log-probs, entropies, the closed-form KL to the reference (with `reference`) and each
        step's KL(N(mu_old, std^2) || N(mu_theta, std^2)) = mean_d (mu_theta - mu_old)^2 / (2 std^2),
        UniRL's FlowDPPO divergence (the exact KL of the step Gaussians, `samplers.gaussian_mean_kl`)."""
        terms = self._units(model, batch, units, with_entropy, reference, old_means)
        return (terms.logp(), terms.entropy() if with_entropy else None, terms.stacked(terms.kls),
                terms.stacked(terms.divergences))

    # ----- warm start -------------------------------------------------------------------------------
    def supervised_loss(self, model: nn.Module, rows: Sequence[dict], target_column: str) -> Tensor:
        """The denoising loss on the rows' target images (`target_column`: PIL images or paths; for
        a video family whose latents are pixels, clips: lists of frames), prompts dropped to "" with
        probability `cfg_dropout` so that CFG has an unconditional model.
        Flow: x_s = (1 - s) x0 + s eps, s ~ U(0, 1), target v = eps - x0 (rectified flow);
        eps models: x_t = sqrt(ab_t) x0 + sqrt(1 - ab_t) eps, t ~ U{0..T-1}, target eps (DDPM)."""
        self._sync_devices()
        device, cfg = self.device, self.cfg
        pixels = []
        for i, row in enumerate(rows):
            image = row.get(target_column) if isinstance(row, dict) else None
            if image is None:
                raise KeyError(f"warm start: row {i} has no target image column {target_column!r}")
            if isinstance(image, (list, tuple)):  # a clip's frames -> [3, T, H, W]
                pixels.append(torch.stack([self._target_pixels(f, f"row {i} frame {t}")
                                           for t, f in enumerate(image)], 1))
            else:
                pixels.append(self._target_pixels(image, f"row {i}"))
        with torch.no_grad():
            x0 = self.family.image_latents(torch.stack(pixels).to(device))
            keep = torch.rand(len(rows)) >= cfg.cfg_dropout
            texts = [str(self.prompt_of(r)) if k else "" for r, k in zip(rows, keep.tolist())]
            cond = self.family.encode(texts, False)
        x, t, target = self.family.noised(x0, torch.randn_like(x0), device)
        pred = self.family.predict(model, x, t, cond, cfg.guidance_scale, False)
        return torch.nn.functional.mse_loss(pred.float(), target.float())

    def _target_pixels(self, image: Any, where: str) -> Tensor:
        """A target image (PIL or path) as [3, H, W] in [-1, 1] at the configured size."""
        import numpy as np
        from PIL import Image
        if isinstance(image, (str, Path)):
            with Image.open(image) as im:
                image = rgb_image(im, str(image))
        arr = np.asarray(rgb_image(image, where).resize((self.cfg.width, self.cfg.height)), dtype=np.float32)
        return torch.from_numpy(arr).permute(2, 0, 1) / 127.5 - 1

    def _count(self, key: str, value: float) -> None:
        self._counts[key] = self._counts.get(key, 0.0) + value

    def pop_metrics(self) -> dict[str, float]:
        out, self._counts = self._counts, {}
        return out

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        """A LoRA: the PEFT adapter of the denoiser, and the same weights in the diffusers LoRA
        format (`pytorch_lora_weights.safetensors`, rank and alpha in its metadata), so that
        `pipe.load_lora_weights(path)` on the stock pipeline applies it. Full weights: the whole
        pipeline with `model` as its denoiser, loadable by `DiffusionPipeline.from_pretrained(path)`."""
        name = next(k for k, v in self.pipe.components.items() if v is self.family.denoiser)
        if hasattr(model, "peft_config"):
            model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
            if hasattr(self.pipe, "save_lora_weights"):  # pipelines without diffusers LoRA support keep PEFT's
                from peft.utils import get_peft_model_state_dict
                layers = {k.removeprefix("base_model.model."): v
                          for k, v in get_peft_model_state_dict(model, state_dict=state_dict).items()}
                self.pipe.save_lora_weights(path, **{f"{name}_lora_layers": layers,
                                                     f"{name}_lora_adapter_metadata":
                                                         model.peft_config[model.active_adapter].to_dict()})
            return
        if state_dict is not None:  # sharded: a plain denoiser of the same class holding the whole weights
            model = self.parallel.plain_class(model).from_config(model.config)
            model.load_state_dict(state_dict)
        type(self.pipe)(**{**self.pipe.components, name: model}).save_pretrained(path, safe_serialization=True)
