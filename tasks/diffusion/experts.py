"""A denoiser made of several of the pipeline's own transformers, each serving a band of timesteps:
Wan 2.2 A14B's high-noise expert (`transformer`, timesteps t >= boundary) and low-noise expert
(`transformer_2`, t < boundary), with boundary = `boundary_ratio` * `num_train_timesteps`, as the
stock `WanPipeline` switches. The engine trains this one module (LoRA on both experts, or all
their weights); each call routes every row to the expert of its timestep, so a trained step is
taken through the expert that drew it. The experts keep the names of the pipeline components
they are (`component_names`), by which the checkpoints are written (`saving.py`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class TimestepExperts(nn.Module):
    """Experts `component_names[0]` (timesteps >= `boundary`) and `component_names[1]` (below it)."""

    def __init__(self, experts: dict[str, nn.Module], boundary: float):
        super().__init__()
        if len(experts) != 2:
            raise ValueError(f"two experts are switched at a boundary timestep, not {len(experts)}")
        self.component_names = tuple(experts)  # (high-noise expert, low-noise expert)
        for name, expert in experts.items():
            self.add_module(name, expert)
        self.boundary = float(boundary)

    @property
    def experts(self) -> list[nn.Module]:
        return [getattr(self, name) for name in self.component_names]

    @property
    def config(self):
        """The high-noise expert's config (both experts share their shapes: channels, patch, text width)."""
        return self.experts[0].config

    @property
    def dtype(self) -> torch.dtype:
        return self.experts[0].dtype

    def enable_gradient_checkpointing(self) -> None:
        for expert in self.experts:
            expert.enable_gradient_checkpointing()

    def expert_of(self, timestep: float) -> str:
        """The component name of the expert that denoises at model timestep `timestep`."""
        return self.component_names[0 if timestep >= self.boundary else 1]

    def forward(self, hidden_states: Tensor, timestep: Tensor, **kwargs):
        """The experts' call (diffusers' keywords) on rows [B, ...] with timesteps [B]: each row
        through the expert of its timestep, the outputs in the rows' order (a tuple, or the
        experts' output where all rows go to one expert)."""
        high = timestep >= self.boundary  # [B]
        if bool(high.all()) or not bool(high.any()):
            expert = self.experts[0 if bool(high.all()) else 1]
            return expert(hidden_states=hidden_states, timestep=timestep, **kwargs)
        n, parts = len(timestep), []
        for expert, rows in zip(self.experts, (high, ~high)):
            picked = {k: v[rows] if isinstance(v, Tensor) and v.dim() > 0 and len(v) == n else v
                      for k, v in kwargs.items()}
            parts.append(expert(hidden_states=hidden_states[rows], timestep=timestep[rows],
                                **{**picked, "return_dict": False})[0])
        out = torch.empty((n, *parts[0].shape[1:]), dtype=parts[0].dtype, device=parts[0].device)
        out[high], out[~high] = parts[0], parts[1]
        return (out,)
