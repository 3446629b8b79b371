"""The edit demo's held-out judge: the t2v demo's clip CNN (`clip_judge.ClipJudge`) over a
two-frame clip, the source then the edit, naming the edit's colour, its shape and which way the
shape moved from the source (right, left, up, down, or *still*); trained on clean synthetic edit
pairs (`shape_edits.edit_row`, another seed than the demo's data) and on pairs whose edit is not
a shape (scattered pixels: shape *none*, colour and direction not scored), and never used as a
reward. `edit_pair_judge` trains once and caches the weights on disk, as the other demo judges.

The evaluator (`edit_match`) scores an edit 1 when the judge's colour, shape and motion are the
instruction's (its row's `colour`, `shape` and `motion` columns), else 0: a recolouring must keep
the shape in place, a move must keep its colour.
"""

from __future__ import annotations

import functools
import hashlib
import random
from pathlib import Path

import torch
from torch import nn

from mmrl.train.loop.evaluation import Evaluator

from .clip_judge import DIRECTION_CLASSES, ClipJudge, clip_tensor
from .shape_judge import COLOUR_NAMES, SHAPE_CLASSES, _not_a_shape, cached_judge
from .synthetic.shape_edits import edit_row


def labelled_pairs(n: int, size: int, rng: random.Random) -> tuple[list, list[int], list[int], list[int]]:
    """`n` [source, edit] pairs with the edit's colour, shape and motion class indices (-1: not
    scored); one in six edits is not a shape."""
    pairs, colours, shapes, motions = [], [], [], []
    for _ in range(n):
        row = edit_row(size, rng)
        if rng.random() < 1 / 6:
            pairs.append([row["image"], _not_a_shape(size, rng)])
            colours.append(-1)
            shapes.append(SHAPE_CLASSES.index("none"))
            motions.append(-1)
            continue
        pairs.append([row["image"], row["target"]])
        colours.append(COLOUR_NAMES.index(row["colour"]))
        shapes.append(SHAPE_CLASSES.index(row["shape"]))
        motions.append(DIRECTION_CLASSES.index(row["motion"]))
    return pairs, colours, shapes, motions


def train_judge(size: int = 16, seed: int = 2, n: int = 3000, steps: int = 400, batch: int = 64,
                noise: float = 0.1) -> ClipJudge:
    """Train on `n` clean pairs (Gaussian pixel noise of std `noise` on the edit per batch); gradients
    are on inside evaluation's no_grad (its first use trains it)."""
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(seed)
        pairs, colours, shapes, motions = labelled_pairs(n, size, random.Random(seed))
        x = clip_tensor(pairs)  # [n, 6, H, W]: the source's channels, then the edit's
        yc, ys, ym = torch.tensor(colours), torch.tensor(shapes), torch.tensor(motions)
        judge = ClipJudge(2, size)
        optimizer = torch.optim.Adam(judge.parameters(), lr=3e-3)
        scored = nn.CrossEntropyLoss(ignore_index=-1)
        for _ in range(steps):
            pick = torch.randint(n, (batch,))
            xb = x[pick].clone()
            xb[:, 3:] += noise * torch.randn_like(xb[:, 3:])
            c, s, m = judge(xb)
            loss = scored(c, yc[pick]) + nn.functional.cross_entropy(s, ys[pick]) + scored(m, ym[pick])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return judge.eval()


@functools.lru_cache(maxsize=4)
def edit_pair_judge(size: int = 16, seed: int = 2) -> ClipJudge:
    """The judge of `size` x `size` edit pairs: trained once, then loaded from ``$XDG_CACHE_HOME/mmrl``
    (``~/.cache/mmrl``) under a name that hashes the sources it depends on."""
    source = b"".join(Path(f).read_bytes() for f in (__file__, edit_row.__code__.co_filename,
                                                      _not_a_shape.__code__.co_filename,
                                                      ClipJudge.__init__.__code__.co_filename))
    key = hashlib.sha256(source + f"{size}-{seed}".encode()).hexdigest()[:16]
    return cached_judge(f"edit_pair_judge-{key}", lambda: ClipJudge(2, size), lambda: train_judge(size, seed))


def edit_match(seed: int = 2) -> Evaluator:
    def score(prompts, completions, image, colour, shape, motion, **columns):
        if not completions:
            return []
        size = completions[0].size[0]
        pairs = [[source.convert("RGB").resize(edit.size), edit] for source, edit in zip(image, completions)]
        colours, shapes, motions = edit_pair_judge(size, seed).predict(pairs)
        return [float(pc == c and ps == s and pm == m)
                for pc, ps, pm, c, s, m in zip(colours, shapes, motions, colour, shape, motion)]
    return Evaluator("the edit's colour, shape and motion from the source named by a CNN trained on clean "
                     "edit pairs (all right)", score)
