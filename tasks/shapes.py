"""Synthetic grounding: coloured shapes on a canvas, "where is the red circle?" -> its box."""

from __future__ import annotations

import random

from mmrl.registry import DATASETS

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 40)}
SHAPES = ("circle", "square")


def shape_rows(n: int, size: int, objects: int, rng: random.Random) -> list[dict]:
    """Each row: a PIL image with `objects` distinct (colour, shape) pairs, a question about one
    of them, its box in pixels (`boxes`), the image size and an SFT target."""
    from PIL import Image, ImageDraw
    rows = []
    for _ in range(n):
        image = Image.new("RGB", (size, size), (245, 245, 245))
        draw = ImageDraw.Draw(image)
        kinds = rng.sample([(c, s) for c in COLOURS for s in SHAPES], objects)
        boxes = []
        for colour, shape in kinds:
            side = rng.randint(size // 6, size // 3)
            x, y = rng.randint(0, size - side), rng.randint(0, size - side)
            box = [x, y, x + side, y + side]
            (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
            boxes.append(box)
        k = rng.randrange(objects)
        colour, shape = kinds[k]
        box = boxes[k]
        rows.append({"prompt": f"where is the {colour} {shape}?", "image": image, "boxes": [box],
                     "image_size": [size, size], "target": f"<answer>[{box[0]}, {box[1]}, {box[2]}, {box[3]}]</answer>"})
    return rows


@DATASETS.register("shapes")
def shapes(n_train: int = 2000, n_eval: int = 64, size: int = 56, objects: int = 2, seed: int = 0):
    """Shapes drawn later may overlap earlier ones; the question names one (colour, shape)."""
    rng = random.Random(seed)
    return {"train": shape_rows(n_train, size, objects, rng), "eval": shape_rows(n_eval, size, objects, rng)}
