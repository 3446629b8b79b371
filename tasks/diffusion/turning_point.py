"""TP-GRPO step rewards (Tong et al., 'Alleviating Sparse Rewards by Modeling Step-Wise and
Long-Term Sampling Effects in Flow-Based GRPO', github.com/YunzeTong/TurningPoint-GRPO), as the
authors' published run computes them (`scripts/single_node/common_op3.sh` and the op3 reward
pass of `scripts/my_train_sd3_fast_with_op3.py`).

The states before, inside and after the trained (SDE) window, x_0 .. x_W, are each completed by
the ODE to an image and scored: R_0 .. R_W (R_0: the pure-ODE image from the same noise; R_W: the
final one). Step t's increment is d_t = R_{t+1} - R_t; the global trend is D = R_W - R_0 and
s_t = sign(d_t) sign(D). Step t is consistent when sign(d_t) sign(R_W - R_{t+1}) > 0 (its
increment agrees with the rest of the trajectory; never true at the last step, where
R_W - R_{t+1} = 0). Turning points:

    step 0:      consistent_0
    step t >= 1: s_{t-1} < 0 and s_t > 0 (it flips the local trend back to the global one),
                 and consistent_t when `consistent_steps == "all"` (the published run:
                 select_inter_step_only_from_consistent_trajectory=true; "first" drops it)

A turning point's bonus is B_t = eta (R_W - R_t) (use_sde_minus_rt); the step reward is B_t
where B_t != 0 and d_t elsewhere (drop_original_reward_when_having_bonus: a bonus of exactly 0,
i.e. R_t = R_W or eta = 0, keeps d_t). Signs of 0 count as neither agreeing nor disagreeing.

`balanced=True` is the run's `use_balanced_bonus`: over all turning points of the batch, those of
rows with D > 0 and with D < 0 are counted; when both exist, only the min(count) of each sign with
the largest |D| stay turning points (the others, and those with D = 0, get d_t). The choice among
equal |D| (several turning points of one row) is `torch.topk`'s over the turning points in
row-major (row, step) order, as the authors' code makes it. The batch is every row scored
together (the authors balance within each sampling batch of one device).

`TurningPoints` is the diffusion adapter's part that completes the states by the ODE, has them
scored and turns the scores into step rewards (`Policy.step_rewards`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout

from .config import DiffusionConfig
from .family import Family
from .samplers import SAMPLERS

CONSISTENT_STEPS = ("all", "first")


def turning_points(scores: Tensor, consistent_steps: str = "all") -> Tensor:
    """bool [N, W] from the scores R [N, W + 1] of the completed states."""
    if consistent_steps not in CONSISTENT_STEPS:
        raise ValueError(f"policy.tp_consistent_steps={consistent_steps!r} is not one of {CONSISTENT_STEPS}")
    d = scores[:, 1:] - scores[:, :-1]
    s = torch.sign(d) * torch.sign(scores[:, -1:] - scores[:, :1])
    consistent = torch.sign(d) * torch.sign(scores[:, -1:] - scores[:, 1:]) > 0
    out = torch.zeros_like(d, dtype=torch.bool)
    out[:, 1:] = (s[:, :-1] < 0) & (s[:, 1:] > 0)
    if consistent_steps == "all":
        out[:, 1:] &= consistent[:, 1:]
    out[:, 0] = consistent[:, 0]
    return out


def balance(tp: Tensor, trend: Tensor) -> Tensor:
    """`use_balanced_bonus`: tp [N, W] kept for equally many rising (D > 0) and falling (D < 0)
    rows' turning points, the largest |D| of each sign; unchanged unless both signs occur."""
    flat_tp = tp.flatten()
    flat_d = trend[:, None].expand_as(tp).flatten()
    positive = (flat_tp & (flat_d > 0)).nonzero().flatten()
    negative = (flat_tp & (flat_d < 0)).nonzero().flatten()
    keep = min(len(positive), len(negative))
    if keep == 0:
        return tp
    out = torch.zeros_like(flat_tp)
    for idx in (positive, negative):
        out[idx[torch.topk(flat_d[idx].abs(), keep).indices]] = True
    return out.view_as(tp)


def step_rewards(scores: Tensor, eta: float = 1.0, consistent_steps: str = "all",
                 balanced: bool = False) -> tuple[Tensor, Tensor]:
    """(step rewards [N, W], turning points [N, W]) from R [N, W + 1]:
    r_t = eta (R_W - R_t) at a turning point where that is not 0, else d_t."""
    if scores.dim() != 2 or scores.shape[1] < 2:
        raise ValueError(f"turning-point rewards need scores [N, W + 1] with W >= 1; got {tuple(scores.shape)}")
    d = scores[:, 1:] - scores[:, :-1]
    tp = turning_points(scores, consistent_steps)
    if balanced:
        tp = balance(tp, scores[:, -1] - scores[:, 0])
    bonus = eta * tp * (scores[:, -1:] - scores[:, :-1])
    return torch.where(bonus != 0, bonus, d), tp


class TurningPoints:
    """TP-GRPO's step rewards of the rollouts drawn by `family` under settings `cfg`
    (`policy.turning_points`), and the counts it reports (`pop_metrics`)."""

    def __init__(self, family: Family, cfg: DiffusionConfig):
        self.family, self.cfg = family, cfg
        self.counts: dict[str, float] = {}

    @torch.no_grad()
    def complete(self, model: nn.Module, batch: Rollout, k: int, device: torch.device) -> Tensor:
        """The trajectory's state k completed by the ODE (deterministic DDIM) to the last level."""
        ex = batch.extras
        levels = ex["levels"][0].tolist()
        cond = {key: v.to(device) for key, v in ex.items() if key.startswith(("pos/", "neg/"))}
        step_fn = SAMPLERS.get(self.family.deterministic_sampler)
        x = ex["latents"][:, k].to(device)
        for j in range(k, batch.num_units):
            pred = self.family.predict(model, x, ex["timesteps"][0, j], cond, self.cfg.guidance_scale,
                                       self.cfg.classifier_free_guidance)
            x, _ = step_fn(x.float(), pred.float(), levels[j], levels[j + 1], 0.0)
        return x

    def step_rewards(self, model: nn.Module, batch: Rollout, score: Callable[[list[int], list[Any]], dict[str, Tensor]],
                     device: torch.device) -> dict[str, Tensor] | None:
        """TP-GRPO (`Policy.step_rewards`): the states x_a .. x_b around the trained window [a, b)
        completed by the ODE with `model` and scored; step rewards from `step_rewards` on [a, b),
        NaN elsewhere."""
        if not self.cfg.turning_points:
            return None
        trained = batch.unit_mask.bool().any(0).nonzero().flatten().tolist()
        if not trained or trained != list(range(trained[0], trained[-1] + 1)):
            raise ValueError("policy.turning_points needs one contiguous window of trained steps "
                             "(policy.schedule.kind: window or sliding_window)")
        a, b, n = trained[0], trained[-1] + 1, len(batch)
        stochastic = batch.extras["stochastic"][0].tolist()
        cond = {key: v for key, v in batch.extras.items() if key.startswith(("pos/", "neg/"))}  # to decode with
        states, passes = [], 0
        for k in range(a, b + 1):
            if not any(stochastic[k:]):  # the rest is the ODE: the completion is the final image
                states.append(list(batch.completions))
                continue
            passes += batch.num_units - k
            states.append(self.family.decode_in_batches(self.complete(model, batch, k, device), self.cfg, cond))
        calls = passes * (2 if self.cfg.classifier_free_guidance else 1)
        if calls > self.cfg.tp_max_extra_passes:
            raise ValueError(f"policy.tp_max_extra_passes={self.cfg.tp_max_extra_passes}: TP-GRPO needs {calls} "
                             f"extra denoiser calls per rollout for the window [{a}, {b}) of {batch.num_units} steps")
        rows = [i for _ in states for i in range(n)]
        scores = score(rows, [img for state in states for img in state])
        out = {}
        for name, values in scores.items():
            step, tp = step_rewards(values.view(len(states), n).T.double(), self.cfg.tp_eta,
                                    self.cfg.tp_consistent_steps, self.cfg.tp_balanced_bonus)
            full = torch.full((n, batch.num_units), float("nan"), dtype=torch.float64)
            full[:, a:b] = step
            out[name] = full.float()
            self._count("tp_turning_points", float(tp.sum()))
        self._count("tp_extra_denoiser_calls", float(calls * n))
        return out

    def _count(self, key: str, value: float) -> None:
        self.counts[key] = self.counts.get(key, 0.0) + value

    def pop_metrics(self) -> dict[str, float]:
        """The counts since the last call (turning points found, extra denoiser calls), reset."""
        out, self.counts = self.counts, {}
        return out
