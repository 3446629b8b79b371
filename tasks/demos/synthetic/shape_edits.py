"""Synthetic image-editing data: a source image (one coloured shape on a light background, as
`colour_shapes`) and an instruction that changes it ("make the circle blue", "move the square
left"), with the edit the instruction asks for drawn beside it (the warm start's target, the
judges' reference) and the target's colour and shape (the `colour_shape` reward's columns)."""

from __future__ import annotations

import random

from mmrl.registry import DATASETS

from .colour_shapes import BACKGROUND, COLOURS, SHAPES

MOVES = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}


def draw_at(colour: str, shape: str, size: int, box: tuple[int, int, int, int]):
    """A `size` x `size` PIL image: one `colour` `shape` filling `box` (x0, y0, x1, y1, inclusive)."""
    from PIL import Image, ImageDraw
    image = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    (draw.ellipse if shape == "circle" else draw.rectangle)(list(box), fill=COLOURS[colour])
    return image


def edit_row(size: int, rng: random.Random, kind: str | None = None) -> dict:
    """One row: a random shape, then a recolouring or a move of a quarter of the image's side
    (the source placed so that the moved shape stays inside)."""
    colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    kind = kind or rng.choice(("recolour", "move"))
    side = rng.randint(size // 3, size // 2)
    step = size // 4
    if kind == "recolour":
        new = rng.choice([c for c in COLOURS if c != colour])
        x, y = rng.randint(0, size - side), rng.randint(0, size - side)
        prompt, (dx, dy), target_colour, direction = f"make the {shape} {new}", (0, 0), new, "still"
    else:
        direction = rng.choice(list(MOVES))
        dx, dy = (step * d for d in MOVES[direction])
        x = rng.randint(max(0, -dx), size - side - max(0, dx))
        y = rng.randint(max(0, -dy), size - side - max(0, dy))
        prompt, target_colour = f"move the {shape} {direction}", colour
    box = (x, y, x + side - 1, y + side - 1)
    moved = (x + dx, y + dy, x + dx + side - 1, y + dy + side - 1)
    return {"prompt": prompt, "edit": kind, "colour": target_colour, "shape": shape, "source_colour": colour,
            "motion": direction, "shift": [dx, dy],
            "image": draw_at(colour, shape, size, box), "target": draw_at(target_colour, shape, size, moved)}


@DATASETS.register("shape_edits")
def shape_edits(n_train: int = 256, n_eval: int = 16, size: int = 32, seed: int = 0,
                kinds: tuple[str, ...] = ("recolour", "move")) -> dict[str, list[dict]]:
    """Rows {prompt: the instruction, image: the source, target: the edit asked for, edit: its kind,
    colour and shape: the target's, source_colour, motion: the way the shape moves (a `MOVES` key,
    or "still"), shift: [dx, dy] its move in pixels}; the held-out rows alternate the `kinds`."""
    rng = random.Random(seed)
    train = [edit_row(size, rng, rng.choice(kinds)) for _ in range(n_train)]
    held_out = [edit_row(size, rng, kinds[i % len(kinds)]) for i in range(n_eval)]
    return {"train": train, "eval": held_out}


def draw_samples(rows: list[dict], before: list, after: list, out_png) -> None:
    """A PNG grid: each held-out row's source, the edit its instruction asks for (target), then the
    greedy (ODE) edit of the same row and seed before and after RL."""
    from PIL import Image

    from mmrl.train.reporting.tracking import plot_sample_grid
    images, captions = [], []
    for row, b, a in zip(rows, before, after):
        for image, tag in ((row["image"], "source"), (row["target"], "target"), (b, "before"), (a, "after")):
            if not hasattr(image, "convert"):  # a resumed run kept only the type name
                image = Image.new("RGB", (16, 16), (128, 128, 128))
            images.append(image.convert("RGB").resize((96, 96), 0))
            captions.append(f"{row['prompt']} ({tag})")
    plot_sample_grid(images, captions, out_png, ncols=8)
