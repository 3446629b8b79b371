"""Motion of a video from its optical flow: how far and which way its content moves.

The flow between consecutive frames is estimated by phase correlation (torch FFTs), over the
whole frame or over tiles of `block` x `block` pixels (a coarse dense flow). For grey frames a,
b (mean removed) with spectra A, B, the normalised cross-power spectrum
R = B conj(A) / |B conj(A)| has the inverse transform delta(x - d) when b is a shifted by d, so
the peak of ifft(R) is the shift. Shifts are in pixels per frame, x to the right and y downwards (image
rows); a tile can measure shifts below half its size. The sub-pixel part uses the ratio of the
peak to its larger neighbour (`_peak_offset`). Each tile's vector is weighted by the
texture it sees (the std of its pixels in the two frames): a flat tile says nothing and weighs 0.

    motion            mean over frame pairs of |v_t| (v_t the weighted mean flow of pair t), in
                      pixels per frame, or per second with `per_second: true` (needs `fps`)
    motion_direction  mean over frame pairs of (v_t . u) / max(|v_t|, min_speed), in [-1, 1], u
                      the unit vector of the row's `direction` column: right, left, up, down, or
                      an angle in degrees (0 right, 90 up); barely moving content scores near 0
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from mmrl.core.scoring import register_reward

from .outputs import VIDEO
from .video_frames import frame_tensor

DIRECTIONS = {"right": 0.0, "up": 90.0, "left": 180.0, "down": 270.0}


def grey(frames: Tensor) -> Tensor:
    """[T, C, H, W] in [0, 1] -> [T, H, W] luminance (ITU-R BT.601 weights for RGB)."""
    if frames.shape[1] == 1:
        return frames[:, 0]
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=frames.dtype)
    return (frames[:, :3] * weights[:, None, None]).sum(1)


def _peak_offset(left: Tensor, centre: Tensor, right: Tensor) -> Tensor:
    """The sub-pixel position of a phase-correlation peak from its larger neighbour n on one axis:
    the peak of a shift by delta in (0, 1) is sinc-shaped, c(0) = sinc(delta), c(1) =
    sinc(1 - delta), so delta = c(1) / (c(1) + c(0)) (Foroosh et al. 2002); 0 when n <= 0."""
    side = torch.where(right >= left, 1.0, -1.0)
    neighbour = torch.maximum(left, right)
    ratio = neighbour / (neighbour + centre).where(neighbour + centre > 0, 1.0)
    return torch.where(neighbour > 0, side * ratio, 0.0)


def phase_shift(a: Tensor, b: Tensor) -> Tensor:
    """[..., H, W] images a, b -> [..., 2] the shift (dx, dy) that takes a's content to b's."""
    a, b = a - a.mean((-2, -1), keepdim=True), b - b.mean((-2, -1), keepdim=True)
    cross = torch.fft.fft2(b) * torch.fft.fft2(a).conj()
    surface = torch.fft.ifft2(cross / cross.abs().clamp_min(1e-12)).real
    h, w = surface.shape[-2:]
    peak = surface.flatten(-2).argmax(-1)
    py, px = peak // w, peak % w

    def at(dy: int, dx: int) -> Tensor:
        index = (((py + dy) % h) * w + (px + dx) % w)[..., None]
        return surface.flatten(-2).gather(-1, index)[..., 0]

    centre = at(0, 0)
    y = py + _peak_offset(at(-1, 0), centre, at(1, 0))
    x = px + _peak_offset(at(0, -1), centre, at(0, 1))
    y, x = (y + h / 2) % h - h / 2, (x + w / 2) % w - w / 2  # wrap to [-size/2, size/2)
    return torch.stack([x, y], -1)


def flow_field(frames: Tensor, block: int = 0) -> tuple[Tensor, Tensor]:
    """(flow [T-1, nH, nW, 2] in pixels per frame, weights [T-1, nH, nW]) between consecutive
    frames of `frames` ([T, C, H, W] in [0, 1]), one vector per `block`-pixel tile (0: the whole
    frame, nH = nW = 1); edge pixels that fill no whole tile are left out."""
    g = grey(frames.float())
    if block:
        if block < 4 or block > min(g.shape[-2:]):
            raise ValueError(f"block={block} must be at least 4 and at most the frame's side {min(g.shape[-2:])}")
        g = g.unfold(1, block, block).unfold(2, block, block)  # [T, nH, nW, b, b]
    else:
        g = g[:, None, None]
    a, b = g[:-1], g[1:]
    texture = a.flatten(-2).std(-1) + b.flatten(-2).std(-1)
    return phase_shift(a, b), texture


def mean_flow(frames: Tensor, block: int = 0) -> Tensor:
    """[T-1, 2]: each frame pair's texture-weighted mean flow (0 where no tile has texture)."""
    flow, weights = flow_field(frames, block)
    w = weights.flatten(1)
    return (flow.flatten(1, 2) * w[..., None]).sum(1) / w.sum(1, keepdim=True).clamp_min(1e-12)


def direction_vector(direction: Any) -> Tensor:
    """The unit vector (x right, y down) of a direction name or an angle in degrees (90 = up)."""
    if isinstance(direction, str) and direction.strip().lower() in DIRECTIONS:
        degrees = DIRECTIONS[direction.strip().lower()]
    else:
        try:
            degrees = float(direction)
        except (TypeError, ValueError):
            raise ValueError(f"motion_direction: direction {direction!r} is not one of "
                             f"{', '.join(DIRECTIONS)} nor an angle in degrees") from None
    radians = math.radians(degrees)
    return torch.tensor([math.cos(radians), -math.sin(radians)])


def direction_problem(value: Any, **args) -> str | None:
    """The check of the ``direction`` column before any model loads (`direction_vector`'s reading)."""
    try:
        direction_vector(value)
    except ValueError as e:
        return str(e)
    return None


def _video_frames(video: Any) -> Tensor:
    frames = frame_tensor(video)
    if frames.shape[0] < 2:
        raise ValueError(f"a motion reward needs videos of at least 2 frames; got {frames.shape[0]}")
    return frames


@register_reward("motion", outputs=VIDEO)
def motion(prompts, completions, block: int = 0, per_second: bool = False, fps=None, **columns):
    """Mean flow magnitude (module docstring)."""
    if per_second and fps is None:
        raise ValueError("motion: per_second needs the column 'fps'")
    out = []
    for i, video in enumerate(completions):
        speed = float(mean_flow(_video_frames(video), block).norm(dim=-1).mean())
        out.append(speed * float(fps[i]) if per_second else speed)
    return out


@register_reward("motion_direction", outputs=VIDEO, check_columns={"direction": direction_problem})
def motion_direction(prompts, completions, direction, block: int = 0, min_speed: float = 0.5, **columns):
    """Agreement of the flow with the row's `direction` column (module docstring)."""
    if min_speed <= 0:
        raise ValueError(f"motion_direction: min_speed={min_speed} must be > 0")
    out = []
    for video, wanted in zip(completions, direction):
        v = mean_flow(_video_frames(video), block)
        along = v @ direction_vector(wanted)
        out.append(float((along / v.norm(dim=-1).clamp_min(min_speed)).mean()))
    return out
