"""The SDE rollout: the denoising loop that draws a batch of rollouts and records the units they
train. `SDERollout.plan` fixes what each step does for each row (`StepPlan`): the levels and model
timesteps (the family's scheduler), the sampler and its strength (the deterministic one for
greedy rollouts), which steps each row samples by SDE and which it trains (`policy.schedule`,
drawn from the rows' and groups' seeds, `noise.py`), and a BranchGRPO tree's widths
(`branching.py`). `SDERollout.denoise` runs the plan: at step k the denoiser runs once per tree
node (once per row without a tree), the sampler gives each row's Gaussian mean and std, the
stochastic rows draw their step noise from their own generators (the rows under one node taking
its first row's) and the others take the ODE step. The result is a `Trajectory`: the states, the
step log-probs as sampled (0 at deterministic steps), the steps that drew noise and those trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from mmrl.core.seeding import derive_seed

from .branching import Branching, edge_owners, first_rows, pruned_units, representatives, tree_widths
from .config import DiffusionConfig
from .family import Cond, Family
from .noise import STEPS_SALT, WINDOW_SALT, generator, row_seeds
from .samplers import LOGPROB_FORMS, SAMPLERS
from .schedule import StepSchedule


@dataclass
class StepPlan:
    """What the denoising loop of one batch of rollouts does at each step."""

    steps: int  # U
    sampler: str  # the name in SAMPLERS
    strength: float  # the sampler's noise level (0: every step deterministic)
    levels: list[float]  # [U + 1] sigmas (flow) or cumulative alphas (eps models)
    timesteps: Tensor  # [U] the model's timesteps
    row_seeds: list[int]  # [N] each row's seed (`noise.row_seeds`)
    stochastic: Tensor  # bool [N, U] the steps each row samples by SDE
    trained: Tensor  # bool [N, U] the steps the schedule trains (before the tree and the noise draws)
    tree: Branching | None  # BranchGRPO's tree, or None: one node per row
    widths: list[int]  # [U + 1] nodes per group at each depth
    group_size: int
    training_step: int
    keep_states: bool  # keep every state (the step units' latents), or the first only


@dataclass
class Trajectory:
    """A batch of rollouts as the denoising loop drew them."""

    x: Tensor  # [N, ...] the final latents, on the device
    states: list[Tensor]  # U + 1 of [N, ...] fp32 CPU (the first only unless the plan keeps them)
    logps: Tensor  # [N, U] fp32 the step log-probs as sampled, 0 where no noise was drawn
    noisy: Tensor  # bool [N, U] the steps that drew noise
    trained: Tensor  # bool [N, U] the plan's trained steps that drew noise, each tree edge once


def stochastic_rows(schedule: StepSchedule, seeds: Sequence[int], group_size: int, steps: int,
                    training_step: int) -> Tensor:
    """bool [N, U]: the steps each rollout samples by SDE (a random_window is drawn per group)."""
    n = len(seeds) * group_size
    if schedule.kind != "random_window":
        return schedule.stochastic(steps, training_step).expand(n, -1).clone()
    return torch.stack([schedule.stochastic(steps, training_step, generator(derive_seed(s, WINDOW_SALT)))
                        for s in seeds]).repeat_interleave(group_size, 0)


class SDERollout:
    """The denoising loop of rollouts drawn by `family` under settings `cfg` (module docstring)."""

    def __init__(self, family: Family, cfg: DiffusionConfig):
        self.family, self.cfg = family, cfg

    def plan(self, seeds: Sequence[int], group_size: int, greedy: bool, training_step: int,
             latent_shape: tuple[int, ...]) -> StepPlan:
        """The plan of `group_size` rollouts per seed; greedy: the deterministic sampler, nothing trained."""
        cfg = self.cfg
        steps = cfg.eval_num_steps if greedy else cfg.num_steps
        levels, timesteps = self.family.levels(steps, latent_shape)
        rows = row_seeds(seeds, group_size)
        n = len(rows)
        if greedy:
            stochastic, trained = torch.zeros(n, steps, dtype=torch.bool), torch.zeros(n, steps, dtype=torch.bool)
        else:
            stochastic = stochastic_rows(cfg.schedule, seeds, group_size, steps, training_step)
            trained = torch.stack([cfg.schedule.trained(steps, training_step, generator(derive_seed(r, STEPS_SALT)))
                                   for r in rows]) & stochastic
        tree = cfg.branching if cfg.branching.on and not greedy else None
        if tree is not None and tree.train_last_step:  # every edge of the tree, the leaves' own included
            trained[:, -1] = stochastic[:, -1]
        return StepPlan(steps=steps, sampler=self.family.deterministic_sampler if greedy else cfg.sampler,
                        strength=0.0 if greedy else cfg.noise_level, levels=levels, timesteps=timesteps,
                        row_seeds=rows, stochastic=stochastic, trained=trained, tree=tree,
                        widths=tree_widths(tree, group_size, steps, stochastic), group_size=group_size,
                        training_step=training_step, keep_states=not greedy and cfg.units == "steps")

    def denoise(self, model: nn.Module, x: Tensor, cond: Cond, plan: StepPlan, device: torch.device) -> Trajectory:
        """Run the plan from the initial latents `x` [N, ...] (on `device`) with the conditioning [N, ...]."""
        n = len(plan.row_seeds)
        noise_gens = [generator(r) for r in plan.row_seeds]
        states = [x.float().cpu()]
        logps = torch.zeros(n, plan.steps)
        noisy = torch.zeros(n, plan.steps, dtype=torch.bool)
        for k in range(plan.steps):
            x = self.step(model, k, x, cond, plan, noise_gens, logps, noisy, device)
            if plan.keep_states:
                states.append(x.float().cpu())
        trained = plan.trained
        if plan.tree is not None:  # each edge of the tree trained once, on its first row; pruned depths not at all
            trained = trained & edge_owners(plan.tree, plan.group_size, n // plan.group_size, plan.steps)
            trained = trained & ~pruned_units(plan.tree, plan.training_step, plan.steps)
        trained = trained & noisy  # a step that drew no noise (strength 0) has no log-prob
        return Trajectory(x=x, states=states, logps=logps, noisy=noisy, trained=trained)

    def step(self, model: nn.Module, k: int, x: Tensor, cond: Cond, plan: StepPlan, noise_gens: list[torch.Generator],
             logps: Tensor, noisy: Tensor, device: torch.device) -> Tensor:
        """The latents after step k from those before, `x` [N, ...]; the log-probs and the noise
        draws of the step's stochastic rows go into `logps` and `noisy` [N, U]."""
        n, group_size, widths, cfg = len(x), plan.group_size, plan.widths, self.cfg
        num_groups = n // group_size
        step_fn, levels, tree = SAMPLERS.get(plan.sampler), plan.levels, plan.tree
        # the denoiser runs once per node: on its first row, the rows under it taking the result
        reps, index = representatives(first_rows(group_size, num_groups, widths[k]))
        at_nodes = x[reps].float() if widths[k] < group_size else x.float()
        node_cond = {key: v[reps] for key, v in cond.items()} if widths[k] < group_size else cond
        pred = self.family.predict(model, at_nodes, plan.timesteps[k], node_cond, cfg.guidance_scale,
                                   cfg.classifier_free_guidance).float()
        rows = plan.stochastic[:, k].nonzero().flatten().tolist()
        mean, std = step_fn(at_nodes, pred, levels[k], levels[k + 1], plan.strength if rows else 0.0)
        mean = mean[index]
        if not std > 0:
            return mean
        # the SDE on this step's stochastic rows (each drawing its own noise), the ODE on the others
        noise = torch.zeros(n, *x.shape[1:])
        noise[rows] = torch.stack([torch.randn(x.shape[1:], generator=noise_gens[i]) for i in rows])
        # rows under one node after the step take that node's noise (its first row's)
        noise = noise[first_rows(group_size, num_groups, widths[k + 1])[rows]]
        scale = tree.noise_scale if tree is not None and k in tree.at else 1.0
        sde = mean[rows] + scale * std * noise.to(device)
        logps[rows, k] = LOGPROB_FORMS[cfg.cps_logprob](sde, mean[rows], std).cpu()
        noisy[rows, k] = True
        x = mean if len(rows) == n else step_fn(at_nodes, pred, levels[k], levels[k + 1], 0.0)[0][index]
        x[rows] = sde  # (in place: `mean` is not used after this)
        return x

    @staticmethod
    def extras(path: Trajectory, plan: StepPlan, cond: Cond) -> dict[str, Any]:
        """The step units' rollout extras (`policy.py`'s docstring), on the CPU."""
        n = len(plan.row_seeds)
        return {"latents": torch.stack(path.states, 1),
                "levels": torch.tensor(plan.levels, dtype=torch.float64).expand(n, -1).clone(),
                "timesteps": plan.timesteps.float().expand(n, -1).clone(),
                "stochastic": path.noisy,
                **{k: v.cpu() for k, v in cond.items()}}
