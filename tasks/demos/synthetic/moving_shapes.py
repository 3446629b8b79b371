"""Synthetic text-to-video data: prompts ("red circle moving right") and the clip they describe
(one coloured shape on a light background moving `SPEED` pixels per frame the stated way), for
the t2v demo's pre-training, rewards and judge; and the demo's figure of clips, frames in a row."""

from __future__ import annotations

import random
from pathlib import Path

from mmrl.registry import DATASETS

from .colour_shapes import BACKGROUND, COLOURS, SHAPES

DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "up": (0, -1), "down": (0, 1)}  # (dx, dy), y downwards
SPEED = 2  # pixels per frame
FPS = 8  # the clips' frames per second (GIFs, the rows' `fps`)


def draw_clip(colour: str, shape: str, direction: str | None, size: int, frames: int, rng: random.Random,
              speed: int = SPEED, jitter: int | None = None) -> list:
    """`frames` PIL images of `size` x `size`: one `colour` `shape` of random side (size // 3 to
    size // 2) and start, moving `speed` pixels per frame towards `direction` (None: still). The
    start is any that keeps the path in the frame, or with `jitter` k within k pixels of the start
    that centres the path."""
    from PIL import Image, ImageDraw
    dx, dy = DIRECTIONS[direction] if direction is not None else (0, 0)
    side = rng.randint(size // 3, size // 2)
    travel = speed * (frames - 1)
    if side + travel > size:
        raise ValueError(f"a {side}-pixel shape moving {travel} pixels does not fit a {size}-pixel frame")

    def start(d: int) -> int:  # the range along an axis that keeps the whole path in the frame
        low, high = (travel, size - side) if d < 0 else (0, size - side - travel * abs(d))
        if jitter is not None:
            centre = (low + high) // 2
            low, high = max(low, centre - jitter), min(high, centre + jitter)
        return rng.randint(low, high)
    x0, y0 = start(dx), start(dy)
    clip = []
    for t in range(frames):
        image = Image.new("RGB", (size, size), BACKGROUND)
        x, y = x0 + dx * speed * t, y0 + dy * speed * t
        draw = ImageDraw.Draw(image)
        (draw.ellipse if shape == "circle" else draw.rectangle)([x, y, x + side - 1, y + side - 1],
                                                               fill=COLOURS[colour])
        clip.append(image)
    return clip


@DATASETS.register("moving_shapes")
def moving_shapes(n_train: int = 2000, n_eval: int = 64, size: int = 16, frames: int = 4,
                  seed: int = 0, jitter: int | None = None) -> dict[str, list[dict]]:
    """Rows {prompt: "red circle moving right", colour, shape, direction, clip (PIL frames)};
    held-out rows cycle through every colour-shape-direction triple. `jitter` (training clips
    only): each start within that many pixels of the one that centres the path (None: anywhere)."""
    rng = random.Random(seed)
    triples = [(c, s, d) for c in COLOURS for s in SHAPES for d in DIRECTIONS]

    def row(colour, shape, direction, jitter=None):
        return {"prompt": f"{colour} {shape} moving {direction}", "colour": colour, "shape": shape,
                "direction": direction, "clip": draw_clip(colour, shape, direction, size, frames, rng, jitter=jitter)}
    train = [row(*rng.choice(triples), jitter=jitter) for _ in range(n_train)]
    held_out = [row(*triples[i % len(triples)]) for i in range(n_eval)]
    return {"train": train, "eval": held_out}


def _frames(clip, size: int) -> list:
    from PIL import Image
    if not isinstance(clip, (list, tuple)) or not all(hasattr(f, "convert") for f in clip):
        return [Image.new("RGB", (size, size), (128, 128, 128))]  # a resumed run kept only the type name
    return [f.convert("RGB") for f in clip]


def draw_samples(rows: list[dict], before: list, after: list, out_png) -> None:
    """`out_png`: per held-out prompt three rows of frames (the target clip, the greedy (ODE)
    clip of the same prompt and seed before RL, after RL), each frame scaled 4x; beside it one
    GIF per clip (`samples_NN_target|before|after.gif`)."""
    from PIL import Image, ImageDraw
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    scale, label_w, gap = 4, 150, 4
    strips = []
    for i, (row, b, a) in enumerate(zip(rows, before, after)):
        for clip, tag in ((row["clip"], "target"), (b, "before RL"), (a, "after RL")):
            frames = _frames(clip, 16)
            big = [f.resize((f.width * scale, f.height * scale), Image.NEAREST) for f in frames]
            big[0].save(out_png.parent / f"samples_{i:02d}_{tag.split()[0]}.gif", save_all=True,
                        append_images=big[1:], duration=1000 // FPS, loop=0)
            w, h = big[0].size
            strip = Image.new("RGB", (label_w + len(big) * (w + gap), h + gap), "white")
            ImageDraw.Draw(strip).text((4, h // 2 - 12), f"{row['prompt']}\n({tag})", fill=(0, 0, 0))
            for t, frame in enumerate(big):
                strip.paste(frame, (label_w + t * (w + gap), 0))
            strips.append(strip)
    width = max(s.width for s in strips)
    sheet = Image.new("RGB", (width, sum(s.height for s in strips)), "white")
    y = 0
    for s in strips:
        sheet.paste(s, (0, y))
        y += s.height
    sheet.save(out_png)
