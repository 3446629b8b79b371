"""Diffusion and flow-matching text-to-image and text/image-to-video models as policies over
denoising steps: the adapter `diffusion`, which holds a loaded diffusers pipeline, its `Family`
(`family.py`; the families in `families.py` and `video_families.py`) and the parts it is built of.

The unit is one step x_k -> x_{k+1}; its log-prob is the Gaussian log density of the sampler's
step (`samplers.py`), fp32, mean over latent dims. A group shares one initial noise (DanceGRPO)
drawn from the group's seed; each rollout then draws its step noise from its own generator, so a
group depends on its prompt and seed only (`noise.py`). Which steps are stochastic and trained is
`policy.schedule` (`schedule.py`); the denoising loop is `sde_rollout.py`. `unit_slices` gives one
slice per trained step, so the engine backpropagates step by step and memory does not grow with
the number of steps; a step is forwarded (policy and reference) on the rows of the micro-batch
whose `unit_mask` trains it only, its value 0 on the others (`unit_rows.py`, `step_units.py`).

Rollout extras: `latents` [N, U + 1, ...] (the trajectory: step k goes from latents[:, k] to
latents[:, k + 1]), `levels` [N, U + 1] (sigmas or cumulative alphas), `timesteps` [N, U],
`stochastic` [N, U] (the steps each rollout took by SDE; a `random_window` differs per group),
and the prompt conditioning (`pos/...`, `neg/...` when CFG is on), all on the CPU; a step's
tensors move to the device when that step of a micro-batch is scored. The step log-probs as
sampled are `Rollout.rollout_logp` (0 at deterministic steps); a video's `fps` is a column
(`media_columns.py`).

With `policy.branching` (BranchGRPO, `branching.py`) a group is a tree: its rows share their
latents up to the depth where their node splits, the denoiser runs once per node (on its first
row) and a node's rows take its first row's step noise; each edge is a trained unit of that first
row only, and `unit_rewards` gives each unit its node's reward. With `policy.units:
forward_process` (DiffusionNFT, `forward_process.py`) a unit is instead a (final sample, noise
level) pair, and each rollout starts from noise of its own. TP-GRPO's step rewards are
`turning_point.py`, GRPO-Guard's step scales `grpo_guard.py`, the warm start `warm_start.py`, the
checkpoints `saving.py`, the settings' checks `checks.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout
from mmrl.registry import ADAPTERS

from .branching import tree_rewards
from .checks import branching_problems, check_settings, fitted_family, pipeline_problems
from .config import DiffusionConfig
from .experts import TimestepExperts
from .family import Family
from .forward_process import ForwardProcessUnits
from .grpo_guard import batch_scales, scales_problem
from .loading import load_pipeline
from .memory_formula import DiffusionMemory, diffusion_memory
from .media_columns import (column_checks, completion_column_names, completion_columns, completion_kind,
                            conditioning_columns, prompt_conditioning)
from .noise import initial_noise
from .saving import save_denoiser
from .score_units import DiffusionScoreHooks, ScoreUnits
from .sde_rollout import SDERollout
from .step_units import StepTerms, StepUnits
from .turning_point import TurningPoints
from .unit_rows import Reference
from .warm_start import denoising_loss


@ADAPTERS.register("diffusion")
class DiffusionPolicy(DiffusionScoreHooks, Policy):
    """The pipeline's denoiser as a policy (module docstring). Its parts, each built on the family
    and the settings: `sde` (the denoising loop), `steps` (the step units under grad),
    `forward_units` (DiffusionNFT's units), `turning_points` (TP-GRPO's step rewards)."""

    Config = DiffusionConfig
    runs_in_rollout_worker = True

    @classmethod
    def rollout_worker_problem(cls, policy: dict) -> str | None:
        if policy.get("units", "steps") == "forward_process":
            return "policy.units=forward_process (no behaviour log-probs to correct stale rows with)"
        return None

    def __init__(self, cfg: DiffusionConfig, pipe=None):
        if not cfg.model and pipe is None:
            raise ValueError("policy.model must name a diffusers pipeline (hub id, local path, or tiny:NAME)")
        check_settings(cfg)
        self.cfg = cfg
        self.pipe = pipe if pipe is not None else load_pipeline(cfg)
        self.family: Family = fitted_family(cfg, self.pipe)
        for module in self.pipe.components.values():
            if isinstance(module, nn.Module):
                module.requires_grad_(False).eval()
        self.model = self.family.denoiser
        self.model.requires_grad_(True)
        self.partial_backward = isinstance(self.model, TimestepExperts)  # a step's backward reaches its expert only
        if cfg.gradient_checkpointing:  # recompute the denoiser's activations in backward
            self.model.enable_gradient_checkpointing()
        if cfg.vae_tiling:
            self.family.enable_tiling()
        if cfg.device:
            self.pipe.to(cfg.device)
        self.training_step = 0
        self._assemble()

    def _assemble(self) -> None:
        """The parts, on the family and the current settings."""
        self.sde = SDERollout(self.family, self.cfg)
        self.steps = StepUnits(self.family, self.cfg)
        self.forward_units = ForwardProcessUnits(self.family, self.cfg)
        self.turning_points = TurningPoints(self.family, self.cfg)
        self.scores = ScoreUnits(self.family, self.cfg)

    def apply_stage_settings(self, changes: dict[str, Any]) -> None:
        super().apply_stage_settings(changes)
        self._assemble()  # the parts hold the settings

    # ----- the contract ------------------------------------------------------------------------
    @classmethod
    def media_columns(cls, cfg: DiffusionConfig) -> dict[str, Callable[[Any], None]]:
        return column_checks(cfg)

    @classmethod
    def required_columns(cls, cfg: DiffusionConfig) -> dict[str, str]:
        return conditioning_columns(cfg)

    @classmethod
    def output_kind(cls, cfg: DiffusionConfig) -> str:
        return completion_kind(cfg)

    @classmethod
    def memory_model(cls, cfg: DiffusionConfig, prompt_length: int) -> DiffusionMemory:
        """The passes traced on the weightless pipeline (`memory_formula.py`); unchecked families refused."""
        return diffusion_memory(cfg, prompt_length)

    @classmethod
    def rollout_columns(cls, cfg: DiffusionConfig) -> tuple[str, ...]:
        return completion_column_names(cfg)

    @classmethod
    def config_problems(cls, cfg: DiffusionConfig) -> list[str]:
        return branching_problems(cfg) + pipeline_problems(cfg)

    @classmethod
    def group_size_problems(cls, cfg: DiffusionConfig, group_size: int) -> list[str]:
        return cfg.branching.group_size_problems(group_size)

    @classmethod
    def unit_terms(cls, cfg: DiffusionConfig) -> str:
        return "implicit_velocity" if cfg.units == "forward_process" else "logprobs"

    @classmethod
    def step_scale_problem(cls, cfg: DiffusionConfig) -> str | None:
        return scales_problem(cfg)

    @classmethod
    def divergence_problem(cls, cfg: DiffusionConfig) -> str | None:
        if cfg.units == "steps":
            return None
        return (f"FlowDPPO's divergence is that of the sampler's Gaussian steps (policy.units: steps), "
                f"not of policy.units={cfg.units!r}")

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
        """`group_size` rollouts of each prompt, group g drawn from `seeds[g]` alone, in six phases:
        1. the frozen components join the denoiser's device;
        2. each prompt's conditioning (its text, its row's image), once per rollout (`media_columns.py`);
        3. the initial noise: one per group, one per row under the forward process (`noise.py`);
        4. the plan: the levels, the steps each row samples by SDE and trains, a tree (`SDERollout.plan`);
        5. the denoising loop (`SDERollout.denoise`), its final latents decoded to the completions;
        6. the record: the trajectory's step units, or the forward-process units, or for a greedy
           rollout (evaluation) the completions alone."""
        cfg, forward = self.cfg, self.cfg.units == "forward_process" and not greedy
        self._sync_devices()
        texts = [str(self.prompt_of(p)) for p in prompts]
        cond = prompt_conditioning(self.family, cfg, prompts, texts, group_size)
        x = initial_noise(self.family, cfg, seeds, group_size, own_noise=forward).to(self.device)
        plan = self.sde.plan(seeds, group_size, greedy, self.training_step, tuple(x.shape))
        path = self.sde.denoise(self.model, x, cond, plan, self.device)
        images = self.family.decode_in_batches(path.x, cfg, cond)
        if forward:
            units = self.forward_units.unit_mask(plan.row_seeds, len(plan.timesteps))
            extras = self.forward_units.extras(path.x, plan.levels, plan.timesteps, cond, plan.row_seeds)
            logps = None
        else:
            units, logps = path.trained.float(), None if greedy else path.logps
            extras = {} if greedy else self.sde.extras(path, plan, cond)
        return Rollout(group_id=torch.arange(len(texts)).repeat_interleave(group_size),
                       prompts=[t for t in texts for _ in range(group_size)], completions=images,
                       unit_mask=units, extras=extras, rollout_logp=logps,
                       columns=completion_columns(self.family, cfg, len(plan.row_seeds)))

    def unit_rewards(self, batch: Rollout, rewards: dict[str, Tensor]) -> dict[str, Tensor] | None:
        """BranchGRPO's node rewards (`branching.tree_rewards`)."""
        return tree_rewards(self.cfg.branching, batch, rewards)

    def step_rewards(self, batch: Rollout, score: Callable[[list[int], list[Any]], dict[str, Tensor]]
                     ) -> dict[str, Tensor] | None:
        """TP-GRPO's step rewards (`turning_point.TurningPoints`)."""
        return self.turning_points.step_rewards(self.model, batch, score, self.device)

    def pop_metrics(self) -> dict[str, float]:
        return self.turning_points.pop_metrics()

    def step_scales(self, batch: Rollout, units: slice) -> tuple[Tensor, Tensor]:
        """GRPO-Guard's (step std, 1 / |dt|) [B, u] (`grpo_guard.py`)."""
        return batch_scales(batch, units, self.cfg.sampler, self.cfg.noise_level)

    # ----- log-probs and the other unit terms, under grad -------------------------------------------
    def step_means(self, model: nn.Module, batch: Rollout, k: int, rows: Tensor) -> tuple[Tensor, float]:
        """(mean of step k under `model` [r, ...], the step's std) for rows `rows` of a batch of rollouts."""
        return self.steps.means(model, batch, k, rows, self.device)

    def _step_terms(self, model: nn.Module, batch: Rollout, units: slice, reference: Reference | None = None,
                    old_means: Tensor | None = None, keep_means: bool = False) -> StepTerms:
        return self.steps.terms(model, batch, units, self.device, self.parallel.is_sharded(model), reference,
                                old_means, keep_means)

    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """Step log-probs; under `units: forward_process` the flow-matching surrogate of each unit's
        log-likelihood, -mean_d (v_theta(x_t) - (eps - x0))^2 (no entropy)."""
        if self.cfg.units == "forward_process":
            return self.forward_units.logprobs(model, batch, units, self.device, self.parallel.is_sharded(model)), None
        terms = self._step_terms(model, batch, units)
        return terms.logp(), terms.entropy() if with_entropy else None

    def implicit_velocity_losses(self, model: nn.Module, batch: Rollout, units: slice, beta: float,
                                 reference: Reference | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """DiffusionNFT's (L+, L-) [B, u] (`forward_process.py`), the old velocity being `model`'s own,
        detached (the policy at the step's start: one update pass), and with `reference` the
        authors' KL, mean_d (v_theta - v_ref)^2; each unit computed on the rows that train it, 0 elsewhere."""
        return self.forward_units.losses(model, batch, units, beta, self.device, self.parallel.is_sharded(model),
                                         reference)

    def logprobs_and_kl(self, model: nn.Module, reference: Reference, batch: Rollout, units: slice = slice(None),
                        with_entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """Log-probs and the closed-form KL of each step to the reference (entered through
        `reference()`), ||mu_theta - mu_ref||^2 / (2 std^2), mean over latent dims (`policy.kl_form`:
        exact, or Flow-GRPO's, |dt| times that for flow_sde)."""
        terms = self._step_terms(model, batch, units, reference)
        return terms.logp(), terms.entropy() if with_entropy else None, terms.stacked(terms.kls)

    def logprobs_and_means(self, model: nn.Module, batch: Rollout, units: slice = slice(None)) -> tuple[Tensor, Tensor]:
        """Step log-probs and the step means [B, u, ...] (fp32), kept as the old policy's for FlowDPPO."""
        terms = self._step_terms(model, batch, units, keep_means=True)
        return terms.logp(), terms.stacked(terms.means)

    def logprobs_and_divergence(self, model: nn.Module, batch: Rollout, units: slice, old_means: Tensor,
                                reference: Reference | None = None,
                                with_entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
        """Step log-probs, entropies, the closed-form KL to the reference (with `reference`) and each
        step's KL(N(mu_old, std^2) || N(mu_theta, std^2)) = mean_d (mu_theta - mu_old)^2 / (2 std^2),
        UniRL's FlowDPPO divergence (the exact KL of the step Gaussians, `samplers.gaussian_mean_kl`)."""
        terms = self._step_terms(model, batch, units, reference, old_means)
        return (terms.logp(), terms.entropy() if with_entropy else None, terms.stacked(terms.kls),
                terms.stacked(terms.divergences))

    # ----- warm start and checkpoints ---------------------------------------------------------------
    def supervised_loss(self, model: nn.Module, rows: Sequence[dict], target_column: str) -> Tensor:
        """The denoising loss on the rows' target images or clips (`warm_start.py`)."""
        self._sync_devices()
        return denoising_loss(self.family, self.cfg, model, rows, target_column, self.prompt_of, self.device)

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        """A LoRA in the PEFT and diffusers formats, or the whole pipeline (`saving.py`)."""
        save_denoiser(self.pipe, self.family.denoiser, model, path, state_dict, self.parallel.plain_class)
