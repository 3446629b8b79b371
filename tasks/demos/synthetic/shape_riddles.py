"""Synthetic think-then-draw data: riddles that name a colour and a shape without saying either
("a shape with no corners, coloured like grass"), the plain prompt a thinker should rewrite them
to ("green circle", the t2i demo's prompts), and the drawing of that prompt (the think-draw demo).

Each colour and each shape has two riddle phrases. The training rows pair the phrases in some
combinations; the held-out rows use the combinations that training never shows (every colour-shape
pair once per phrase combination left out), so a thinker must read the two halves of a riddle
separately to rewrite them."""

from __future__ import annotations

import random

from mmrl.registry import DATASETS

from .colour_shapes import COLOURS, SHAPES, draw_shape

COLOUR_PHRASES = {"red": ("like a ripe tomato", "like fresh blood"), "green": ("like grass", "like a leaf"),
                  "blue": ("like the sky", "like the deep sea"), "yellow": ("like a lemon", "like the sun")}
SHAPE_PHRASES = {"circle": ("a shape with no corners", "a round thing"),
                 "square": ("a shape with four corners", "a box seen from above")}


def riddle(colour: str, shape: str, colour_phrase: int, shape_phrase: int) -> str:
    """The riddle of (`colour`, `shape`) in the phrases numbered `colour_phrase` and `shape_phrase`."""
    return f"{SHAPE_PHRASES[shape][shape_phrase]}, coloured {COLOUR_PHRASES[colour][colour_phrase]}"


def held_out_phrasing(colour: str, shape: str) -> tuple[int, int]:
    """The one (colour phrase, shape phrase) combination of a colour-shape pair kept for evaluation:
    it varies with the pair, so every phrase appears in training with some pair."""
    k = list(COLOURS).index(colour) + SHAPES.index(shape)
    return k % 2, (k // 2) % 2


@DATASETS.register("shape_riddles")
def shape_riddles(n_train: int = 256, n_eval: int = 16, size: int = 16, seed: int = 0) -> dict[str, list[dict]]:
    """Rows {prompt: the riddle, rewrite: "green circle", colour, shape, image: the drawing of the
    rewrite}; training rows draw from the 3 phrasings of each pair that the held-out rows do not use,
    the held-out rows cycle through every pair in its held-out phrasing."""
    rng = random.Random(seed)
    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    seen = [(c, s, cp, sp) for c, s in pairs for cp in (0, 1) for sp in (0, 1) if (cp, sp) != held_out_phrasing(c, s)]

    def row(colour, shape, cp, sp):
        return {"prompt": riddle(colour, shape, cp, sp), "rewrite": f"{colour} {shape}", "colour": colour,
                "shape": shape, "image": draw_shape(colour, shape, size, rng)}
    train = [row(*rng.choice(seen)) for _ in range(n_train)]
    held_out = [row(*pairs[i % len(pairs)], *held_out_phrasing(*pairs[i % len(pairs)])) for i in range(n_eval)]
    return {"train": train, "eval": held_out}


def draw_samples(rows: list[dict], before: list, after: list, out_png) -> None:
    """A PNG grid: each held-out riddle's target drawing, then the greedy episode's drawing before
    and after RL (the thinker's rewrites are in ``samples/*/samples.json``)."""
    from PIL import Image

    from mmrl.train.reporting.tracking import plot_sample_grid
    images, captions = [], []
    for row, b, a in zip(rows, before, after):
        for image, tag in ((row["image"], f"target {row['rewrite']}"), (b, "before"), (a, "after")):
            if not hasattr(image, "convert"):  # a resumed run kept only the type name
                image = Image.new("RGB", (16, 16), (128, 128, 128))
            images.append(image.convert("RGB").resize((96, 96), 0))
            captions.append(f"{row['prompt'][:28]} ({tag})")
    plot_sample_grid(images, captions, out_png, ncols=6)
