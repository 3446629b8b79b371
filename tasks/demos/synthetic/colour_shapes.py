"""Synthetic text-to-image data: short prompts ("red circle") and the image they describe
(one coloured shape on a light background), for the t2i demo's pre-training and rewards."""

from __future__ import annotations

import random

from mmrl.registry import DATASETS

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 40)}
SHAPES = ("circle", "square")
BACKGROUND = (245, 245, 245)


def draw_shape(colour: str, shape: str, size: int, rng: random.Random):
    """A `size` x `size` PIL image: one `colour` `shape` of random side and position."""
    from PIL import Image, ImageDraw
    image = Image.new("RGB", (size, size), BACKGROUND)
    side = rng.randint(size // 3, size // 2 + 2)
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    box = [x, y, x + side - 1, y + side - 1]
    (ImageDraw.Draw(image).ellipse if shape == "circle" else ImageDraw.Draw(image).rectangle)(box, fill=COLOURS[colour])
    return image


@DATASETS.register("colour_shapes")
def colour_shapes(n_train: int = 256, n_eval: int = 16, size: int = 32, seed: int = 0) -> dict[str, list[dict]]:
    """Rows {prompt: "red circle", colour, shape, image}; held-out rows cycle through every
    colour-shape pair."""
    rng = random.Random(seed)
    pairs = [(c, s) for c in COLOURS for s in SHAPES]

    def row(colour, shape):
        return {"prompt": f"{colour} {shape}", "colour": colour, "shape": shape,
                "image": draw_shape(colour, shape, size, rng)}
    train = [row(*rng.choice(pairs)) for _ in range(n_train)]
    held_out = [row(*pairs[i % len(pairs)]) for i in range(n_eval)]
    return {"train": train, "eval": held_out}


def draw_samples(rows: list[dict], before: list, after: list, out_png) -> None:
    """A PNG grid: each held-out prompt's target drawing, then the greedy (ODE) sample of the
    same prompt and seed before and after RL."""
    from PIL import Image

    from mmrl.train.reporting.tracking import plot_sample_grid
    images, captions = [], []
    for row, b, a in zip(rows, before, after):
        for image, tag in ((row["image"], "target"), (b, "before"), (a, "after")):
            if not hasattr(image, "convert"):  # a resumed run kept only the type name
                image = Image.new("RGB", (16, 16), (128, 128, 128))
            images.append(image.convert("RGB").resize((96, 96), 0))
            captions.append(f"{row['prompt']} ({tag})")
    plot_sample_grid(images, captions, out_png, ncols=6)
