"""The t2i demo's held-out judge: a small CNN that names the colour and the shape of an image,
trained on clean synthetic drawings (`synthetic.draw_shape`) and never used as a reward.

Three shape classes: circle, square and *none*, the last trained on what is not a shape (the
blank background, and a colour's pixels scattered over it), so that faint scattered pixels of
the right colour are not judged a circle or a square. Colour has four classes (`COLOURS`) and is
not scored on *none* images. Training is deterministic (`seed`) and takes 15-90 s on 2 CPU cores
(idle to loaded); `shape_judge` trains once and caches the weights on disk.

The evaluator (`shape_colour_match`) scores a generated image 1 when the judge's colour and
shape are the prompt's, else 0.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mmrl.train.loop.evaluation import Evaluator

from .synthetic.colour_shapes import BACKGROUND, COLOURS, SHAPES, draw_shape

SHAPE_CLASSES = (*SHAPES, "none")
COLOUR_NAMES = tuple(COLOURS)


def to_tensor(images) -> torch.Tensor:
    """PIL images -> float [B, 3, H, W] in [-1, 1]."""
    arrays = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) for im in images])
    return torch.from_numpy(arrays).permute(0, 3, 1, 2) / 127.5 - 1.0


class ShapeJudge(nn.Module):
    """Three 3x3 convolutions, two max-pools (a quarter of the side), linear colour and shape heads."""

    def __init__(self, size: int = 16, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        flat = 2 * width * (size // 4) ** 2
        self.colour = nn.Linear(flat, len(COLOUR_NAMES))
        self.shape = nn.Linear(flat, len(SHAPE_CLASSES))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.features(x)
        return self.colour(h), self.shape(h)

    @torch.no_grad()
    def predict(self, images) -> tuple[list[str], list[str]]:
        colour, shape = self(to_tensor(images))
        return ([COLOUR_NAMES[i] for i in colour.argmax(-1).tolist()],
                [SHAPE_CLASSES[i] for i in shape.argmax(-1).tolist()])


def _not_a_shape(size: int, rng: random.Random):
    """The background, with a colour's pixels scattered at random (up to a third of the canvas)."""
    from PIL import Image
    image = Image.new("RGB", (size, size), BACKGROUND)
    colour = COLOURS[rng.choice(COLOUR_NAMES)]
    for _ in range(rng.randint(0, size * size // 3)):
        image.putpixel((rng.randrange(size), rng.randrange(size)), colour)
    return image


def labelled_images(n: int, size: int, rng: random.Random) -> tuple[list, list[int], list[int]]:
    """`n` images with their colour and shape class indices (colour -1 for *none*); one in five is not a shape."""
    images, colours, shapes = [], [], []
    for _ in range(n):
        if rng.random() < 0.2:
            images.append(_not_a_shape(size, rng))
            colours.append(-1)
            shapes.append(SHAPE_CLASSES.index("none"))
        else:
            c, s = rng.choice(COLOUR_NAMES), rng.choice(SHAPES)
            images.append(draw_shape(c, s, size, rng))
            colours.append(COLOUR_NAMES.index(c))
            shapes.append(SHAPE_CLASSES.index(s))
    return images, colours, shapes


def train_judge(size: int = 16, seed: int = 0, n: int = 2000, steps: int = 250, batch: int = 64,
                noise: float = 0.1) -> ShapeJudge:
    """Train on `n` clean drawings (Gaussian pixel noise of std `noise` added per batch, in [-1, 1] units).
    Gradients are on even when called inside evaluation's no_grad (its first use trains it)."""
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(seed)
        images, colours, shapes = labelled_images(n, size, random.Random(seed))
        x, yc, ys = to_tensor(images), torch.tensor(colours), torch.tensor(shapes)
        judge = ShapeJudge(size)
        optimizer = torch.optim.Adam(judge.parameters(), lr=3e-3)
        colour_loss = nn.CrossEntropyLoss(ignore_index=-1)
        for _ in range(steps):
            pick = torch.randint(n, (batch,))
            xb = x[pick] + noise * torch.randn_like(x[pick])
            c, s = judge(xb)
            loss = colour_loss(c, yc[pick]) + nn.functional.cross_entropy(s, ys[pick])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return judge.eval()


@functools.lru_cache(maxsize=4)
def shape_judge(size: int = 16, seed: int = 0) -> ShapeJudge:
    """The judge for `size` x `size` images: trained once, then loaded from
    ``$XDG_CACHE_HOME/mmrl`` (``~/.cache/mmrl``), under a name that hashes this module's source, so
    a changed recipe retrains."""
    source = Path(__file__).read_bytes() + Path(draw_shape.__code__.co_filename).read_bytes()
    key = hashlib.sha256(source + f"{size}-{seed}".encode()).hexdigest()[:16]
    return cached_judge(f"shape_judge-{key}", lambda: ShapeJudge(size), lambda: train_judge(size, seed))


def cached_judge(name: str, empty, train):
    """A demo judge trained once (`train()`), then loaded from ``$XDG_CACHE_HOME/mmrl/NAME.pt``
    (``~/.cache/mmrl``) into `empty()`; written atomically, and trained again next time where the
    cache is read-only."""
    path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mmrl" / f"{name}.pt"
    if path.is_file():
        judge = empty()
        judge.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return judge.eval()
    judge = train()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(judge.state_dict(), tmp)
        os.replace(tmp, path)
    except OSError:  # a read-only home: train again next time
        pass
    return judge


def shape_colour_match(seed: int = 0) -> Evaluator:
    def score(prompts, completions, colour, shape, **columns):
        if not completions:
            return []
        size = completions[0].size[0]
        colours, shapes = shape_judge(size, seed).predict(completions)
        return [float(pc == c and ps == s) for pc, ps, c, s in zip(colours, shapes, colour, shape)]
    return Evaluator("colour and shape named by a CNN trained on clean drawings (both right)", score)
