"""The t2v demo's held-out judge: a small CNN that names the colour, the shape and the direction
of motion of a clip (its frames stacked on the channel axis), trained on clean synthetic clips
(`moving_shapes.draw_clip`, another seed than the demo's data) and never used as a reward.

Shape classes: circle, square and *none* (the blank background with a colour's pixels scattered
over it, fresh in every frame); direction classes: right, left, up, down and *still* (a shape
that does not move), so that a clip that does not move earns no direction by chance. Colour and
direction are not scored on *none* clips. `clip_judge` trains once and caches the weights on
disk, as the t2i demo's `shape_judge`.

The evaluator (`clip_match`) scores a generated clip 1 when the judge's colour, shape and
direction are the prompt's, else 0.
"""

from __future__ import annotations

import functools
import hashlib
import random
from pathlib import Path

import torch
from torch import nn

from mmrl.train.loop.evaluation import Evaluator

from .shape_judge import COLOUR_NAMES, SHAPE_CLASSES, _not_a_shape, cached_judge, to_tensor
from .synthetic.colour_shapes import SHAPES
from .synthetic.moving_shapes import DIRECTIONS, draw_clip

DIRECTION_CLASSES = (*DIRECTIONS, "still")


def clip_tensor(clips) -> torch.Tensor:
    """Clips (lists of T PIL frames) -> float [B, 3 T, H, W] in [-1, 1]."""
    return torch.stack([to_tensor(frames).flatten(0, 1) for frames in clips])


class ClipJudge(nn.Module):
    """Three 3x3 convolutions over the stacked frames, two max-pools, linear colour, shape and
    direction heads."""

    def __init__(self, frames: int = 4, size: int = 16, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3 * frames, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        flat = 2 * width * (size // 4) ** 2
        self.colour = nn.Linear(flat, len(COLOUR_NAMES))
        self.shape = nn.Linear(flat, len(SHAPE_CLASSES))
        self.direction = nn.Linear(flat, len(DIRECTION_CLASSES))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.features(x)
        return self.colour(h), self.shape(h), self.direction(h)

    @torch.no_grad()
    def predict(self, clips) -> tuple[list[str], list[str], list[str]]:
        colour, shape, direction = self(clip_tensor(clips))
        return ([COLOUR_NAMES[i] for i in colour.argmax(-1).tolist()],
                [SHAPE_CLASSES[i] for i in shape.argmax(-1).tolist()],
                [DIRECTION_CLASSES[i] for i in direction.argmax(-1).tolist()])


def labelled_clips(n: int, frames: int, size: int, rng: random.Random) -> tuple[list, list[int], list[int], list[int]]:
    """`n` clips with colour, shape and direction class indices (-1: not scored); one in six is not
    a shape, one in six of the shapes stands still."""
    clips, colours, shapes, directions = [], [], [], []
    for _ in range(n):
        if rng.random() < 1 / 6:
            clips.append([_not_a_shape(size, rng) for _ in range(frames)])
            colours.append(-1)
            shapes.append(SHAPE_CLASSES.index("none"))
            directions.append(-1)
            continue
        c, s = rng.choice(COLOUR_NAMES), rng.choice(SHAPES)
        d = None if rng.random() < 1 / 6 else rng.choice(tuple(DIRECTIONS))
        clips.append(draw_clip(c, s, d, size, frames, rng))
        colours.append(COLOUR_NAMES.index(c))
        shapes.append(SHAPE_CLASSES.index(s))
        directions.append(DIRECTION_CLASSES.index(d or "still"))
    return clips, colours, shapes, directions


def train_judge(frames: int = 4, size: int = 16, seed: int = 1, n: int = 3000, steps: int = 400, batch: int = 64,
                noise: float = 0.1) -> ClipJudge:
    """Train on `n` clean clips (Gaussian pixel noise of std `noise` added per batch); gradients
    are on inside evaluation's no_grad (its first use trains it)."""
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(seed)
        clips, colours, shapes, directions = labelled_clips(n, frames, size, random.Random(seed))
        x = clip_tensor(clips)
        yc, ys, yd = torch.tensor(colours), torch.tensor(shapes), torch.tensor(directions)
        judge = ClipJudge(frames, size)
        optimizer = torch.optim.Adam(judge.parameters(), lr=3e-3)
        scored = nn.CrossEntropyLoss(ignore_index=-1)
        for _ in range(steps):
            pick = torch.randint(n, (batch,))
            c, s, d = judge(x[pick] + noise * torch.randn_like(x[pick]))
            loss = scored(c, yc[pick]) + nn.functional.cross_entropy(s, ys[pick]) + scored(d, yd[pick])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return judge.eval()


@functools.lru_cache(maxsize=4)
def clip_judge(frames: int = 4, size: int = 16, seed: int = 1) -> ClipJudge:
    """The judge for clips of `frames` frames of `size` x `size`: trained once, then loaded from
    ``$XDG_CACHE_HOME/mmrl`` (``~/.cache/mmrl``) under a name that hashes the sources it depends on."""
    source = b"".join(Path(f).read_bytes() for f in (__file__, draw_clip.__code__.co_filename,
                                                      _not_a_shape.__code__.co_filename))
    key = hashlib.sha256(source + f"{frames}-{size}-{seed}".encode()).hexdigest()[:16]
    return cached_judge(f"clip_judge-{key}", lambda: ClipJudge(frames, size), lambda: train_judge(frames, size, seed))


def clip_match(seed: int = 1) -> Evaluator:
    def score(prompts, completions, colour, shape, direction, **columns):
        if not completions:
            return []
        frames, size = len(completions[0]), completions[0][0].size[0]
        colours, shapes, directions = clip_judge(frames, size, seed).predict(completions)
        return [float(pc == c and ps == s and pd == d)
                for pc, ps, pd, c, s, d in zip(colours, shapes, directions, colour, shape, direction)]
    return Evaluator("colour, shape and direction of motion named by a CNN trained on clean clips (all right)", score)
