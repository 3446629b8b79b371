"""Synthetic grounding: coloured shapes on a canvas, "where is the red circle?" -> its box."""

from __future__ import annotations

import random
import re
from pathlib import Path

from mmrl.registry import DATASETS
from mmrl.train.reporting.tracking import plot_sample_grid

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 40)}
SHAPES = ("circle", "square")


def _canvas(kinds: list[tuple[str, str]], size: int, rng: random.Random):
    """A PIL image with one shape per (colour, shape) in `kinds`, and their boxes in pixels."""
    from PIL import Image, ImageDraw
    image = Image.new("RGB", (size, size), (245, 245, 245))
    draw = ImageDraw.Draw(image)
    boxes = []
    for colour, shape in kinds:
        side = rng.randint(size // 6, size // 3)
        x, y = rng.randint(0, size - side), rng.randint(0, size - side)
        box = [x, y, x + side, y + side]
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
        boxes.append(box)
    return image, boxes


def shape_rows(n: int, size: int, objects: int, rng: random.Random) -> list[dict]:
    """Each row: a PIL image with `objects` distinct (colour, shape) pairs, a question about one
    of them, its box in pixels (`boxes`), the image size and an SFT target."""
    rows = []
    for _ in range(n):
        kinds = rng.sample([(c, s) for c in COLOURS for s in SHAPES], objects)
        image, boxes = _canvas(kinds, size, rng)
        k = rng.randrange(objects)
        colour, shape = kinds[k]
        box = boxes[k]
        rows.append({"prompt": f"where is the {colour} {shape}?", "image": image, "boxes": [box],
                     "image_size": [size, size], "target": f"<answer>[{box[0]}, {box[1]}, {box[2]}, {box[3]}]</answer>"})
    return rows


def count_rows(n: int, size: int, max_objects: int, rng: random.Random) -> list[dict]:
    """Each row: 1..`max_objects` distinct shapes (they may overlap), "how many shapes?", the
    count as `answer` and a think-then-answer SFT target (the reasoning shape of Vision-R1)."""
    kinds_all = [(c, s) for c in COLOURS for s in SHAPES]
    rows = []
    for _ in range(n):
        kinds = rng.sample(kinds_all, rng.randint(1, max_objects))
        image, _ = _canvas(kinds, size, rng)
        names = ", ".join(f"{c} {s}" for c, s in kinds)
        rows.append({"prompt": "how many shapes are there? think in <think></think>, then answer in "
                               "<answer></answer>", "image": image, "answer": str(len(kinds)),
                     "target": f"<think>{names}</think><answer>{len(kinds)}</answer>"})
    return rows


@DATASETS.register("shape_counts")
def shape_counts(n_train: int = 2000, n_eval: int = 64, size: int = 56, max_objects: int = 4, seed: int = 0):
    """Counting shapes (a small visual-math question with a verifiable numeric answer)."""
    rng = random.Random(seed)
    return {"train": count_rows(n_train, size, max_objects, rng), "eval": count_rows(n_eval, size, max_objects, rng)}


@DATASETS.register("shapes")
def shapes(n_train: int = 2000, n_eval: int = 64, size: int = 56, objects: int = 2, seed: int = 0):
    """Shapes drawn later may overlap earlier ones; the question names one (colour, shape)."""
    rng = random.Random(seed)
    return {"train": shape_rows(n_train, size, objects, rng), "eval": shape_rows(n_eval, size, objects, rng)}


def answer_box(text: str) -> list[float] | None:
    """The first four numbers of the demo's answer format `<answer>[x1, y1, x2, y2]</answer>`."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text.split("<answer>")[-1])
    return [float(v) for v in numbers[:4]] if len(numbers) >= 4 else None


def draw_predictions(rows: list[dict], before: list[str], after: list[str], out_png: str | Path) -> None:
    """Each held-out image with its true box (green), the greedy box before RL (red) and after
    RL (blue), in a PNG grid."""
    from PIL import ImageDraw
    images, captions = [], []
    for row, b, a in zip(rows, before, after):
        image = row["image"].convert("RGB").resize((224, 224))
        scale = 224 / row["image_size"][0]
        draw = ImageDraw.Draw(image)
        for box, colour in ((row["boxes"][0], (0, 160, 0)), (answer_box(b), (220, 0, 0)), (answer_box(a), (0, 0, 230))):
            if box is not None and box[2] > box[0] and box[3] > box[1]:
                draw.rectangle([v * scale for v in box], outline=colour, width=2)
        images.append(image)
        captions.append(row["prompt"])
    plot_sample_grid(images, captions, out_png, ncols=4)
