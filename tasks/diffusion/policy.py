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

from contextlib import AbstractContextManager
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
from .forward_process import ForwardProcessUnits
from .loading import load_pipeline
from .media_columns import column_checks, completion_columns, prompt_conditioning
from .samplers import EPS_SAMPLERS, KL_FORMS, LOGPROB_FORMS, SAMPLERS, flow_grpo_kl_factor
from .step_units import Reference, StepTerms, StepUnits
from .turning_point import TurningPointRewards

NOISE_SALT, STEPS_SALT, FORWARD_SALT, WINDOW_SALT = 0x5DE, 0x57E, 0xF0D, 0x3D0


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
        self.steps = StepUnits(self.family, cfg)
        self.forward_units = ForwardProcessUnits(self.family, cfg)

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
                logps[rows, k] = self.steps.logprob(sde, mean[rows], std).cpu()
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
            units = self.forward_units.unit_mask(row_seeds, len(timesteps))
            extras = self.forward_units.extras(x, levels, timesteps, cond, row_seeds)
            return Rollout(group_id=torch.arange(len(texts)).repeat_interleave(group_size),
                           prompts=[t for t in texts for _ in range(group_size)], completions=images,
                           unit_mask=units, extras=extras, columns=completion_columns(self.family, self.cfg, n))
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
                                 reference: Callable[[], AbstractContextManager[nn.Module]] | None = None
                                 ) -> tuple[Tensor, Tensor, Tensor | None]:
        """DiffusionNFT's (L+, L-) [B, u] (`forward_process.py`), the old velocity being `model`'s own,
        detached (the policy at the step's start: one update pass), and with `reference` the
        authors' KL, mean_d (v_theta - v_ref)^2; each unit computed on the rows that train it, 0 elsewhere."""
        return self.forward_units.losses(model, batch, units, beta, self.device, self.parallel.is_sharded(model),
                                         reference)

    def logprobs_and_kl(self, model: nn.Module, reference: Callable[[], AbstractContextManager[nn.Module]],
                        batch: Rollout, units: slice = slice(None),
                        with_entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """Log-probs and the closed-form KL of each step to the reference (entered through
        `reference()`), ||mu_theta - mu_ref||^2 / (2 std^2), mean over latent dims (`policy.kl_form`:
        exact, or Flow-GRPO's, |dt| times that for flow_sde)."""
        terms = self._step_terms(model, batch, units, reference)
        return terms.logp(), terms.entropy() if with_entropy else None, terms.stacked(terms.kls)

    @classmethod
    def divergence_problem(cls, cfg: DiffusionConfig) -> str | None:
        if cfg.units == "steps":
            return None
        return (f"FlowDPPO's divergence is that of the sampler's Gaussian steps (policy.units: steps), "
                f"not of policy.units={cfg.units!r}")

    def logprobs_and_means(self, model: nn.Module, batch: Rollout, units: slice = slice(None)) -> tuple[Tensor, Tensor]:
        """Step log-probs and the step means [B, u, ...] (fp32), kept as the old policy's for FlowDPPO."""
        terms = self._step_terms(model, batch, units, keep_means=True)
        return terms.logp(), terms.stacked(terms.means)

    def logprobs_and_divergence(self, model: nn.Module, batch: Rollout, units: slice, old_means: Tensor,
                                reference: Callable[[], AbstractContextManager[nn.Module]] | None = None,
                                with_entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
        """Step log-probs, entropies, the closed-form KL to the reference (with `reference`) and each
        step's KL(N(mu_old, std^2) || N(mu_theta, std^2)) = mean_d (mu_theta - mu_old)^2 / (2 std^2),
        UniRL's FlowDPPO divergence (the exact KL of the step Gaussians, `samplers.gaussian_mean_kl`)."""
        terms = self._step_terms(model, batch, units, reference, old_means)
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
