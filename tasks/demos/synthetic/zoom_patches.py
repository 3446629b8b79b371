"""Synthetic zoom-in: a large grey canvas with one dark cell that holds a small coloured dot,
"what colour is the dot?". At the policy's input resolution the dot is a pixel or two, blended
into the dark cell; the `zoom` tool's crop of the cell's centre shows it at full resolution, and
larger still where the processor's `min_pixels` enlarges a small crop (the `zoom` demo,
`mmrl demo zoom`).

The canvas is a `grid` x `grid` of cells of `size / grid` pixels; the processor resizes it to
`input_size` pixels a side, where each cell is `input_size / grid` pixels. A zoom's box is in that
input frame (`policy.episode.box_frame: input`, Qwen2.5-VL's); the taught box is `zoom_side`
input pixels a side, centred on the dark cell, where the dot is.

Held-out rows are one question each. Training rows come in pairs, the two model turns of one
tool-using episode, each with its supervised target (`target`) for the warm start: the question
-> the zoom call on the dark cell's centre; the question, that call and the crop it returns -> the answer.
RL reads both kinds of row (a row of the second kind asks for the answer with the crop already in
its context).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from mmrl.registry import DATASETS
from mmrl.train.reporting.tracking import plot_sample_grid

from .shapes import COLOURS

QUESTION = "<image>what colour is the dot in the dark square?"
BACKGROUND, CELL = (235, 235, 235), (70, 70, 70)


def zoom_call(box: list[int]) -> str:
    """The tool call the model writes to zoom into `box` (input frame)."""
    return "<tool_call>" + json.dumps({"name": "zoom", "arguments": {"bbox_2d": box}}, separators=(",", ":")) + "</tool_call>"


def _canvas(colour: str, row: int, col: int, size: int, grid: int, dot: int):
    """The image, the dark cell's box and the dot's box, both in the image's pixels."""
    from PIL import Image, ImageDraw
    cell = size // grid
    image = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    cell_box = [col * cell, row * cell, (col + 1) * cell, (row + 1) * cell]
    draw.rectangle([cell_box[0], cell_box[1], cell_box[2] - 1, cell_box[3] - 1], fill=CELL)
    cx, cy = cell_box[0] + cell // 2, cell_box[1] + cell // 2
    dot_box = [cx - dot // 2, cy - dot // 2, cx - dot // 2 + dot, cy - dot // 2 + dot]
    draw.rectangle([dot_box[0], dot_box[1], dot_box[2] - 1, dot_box[3] - 1], fill=COLOURS[colour])
    return image, cell_box, dot_box


def zoom_rows(n: int, size: int, grid: int, dot: int, input_size: int, zoom_side: int, rng: random.Random,
              with_turns: bool) -> list[dict]:
    """`n` questions (`with_turns`: each followed by the row of its answer turn, for the warm start)."""
    rows = []
    step, scale = input_size // grid, size / input_size
    for _ in range(n):
        colour, row, col = rng.choice(list(COLOURS)), rng.randrange(grid), rng.randrange(grid)
        image, _, dot_box = _canvas(colour, row, col, size, grid, dot)
        x, y = col * step + (step - zoom_side) // 2, row * step + (step - zoom_side) // 2
        box = [x, y, x + zoom_side, y + zoom_side]  # centred on the dark cell, input frame
        call = zoom_call(box)
        common = {"answer": colour, "dot_box": dot_box, "scale": scale}
        rows.append({"prompt": QUESTION, "images": [image], "target": call, **common})
        if with_turns:
            # the answer turn: what an episode's context holds after the zoom (the model's turn ends
            # with the eos it sampled, then the chat template's tool turn with the crop)
            prompt = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": call + "<eos>"},
                      {"role": "tool", "content": "<image>"}]
            crop = image.crop([round(v * scale) for v in box])
            rows.append({"prompt": prompt, "images": [image, crop], "target": f"<answer>{colour}</answer>", **common})
    return rows


@DATASETS.register("zoom_patches")
def zoom_patches(n_train: int = 2000, n_eval: int = 128, size: int = 448, grid: int = 4, dot: int = 8,
                 input_size: int = 112, zoom_side: int | None = None, seed: int = 0):
    """`n_train` training episodes (two rows each) and `n_eval` held-out questions; the taught
    zoom box is `zoom_side` input pixels a side, centred on the dark cell (None: the whole cell)."""
    if size % grid or input_size % grid:
        raise ValueError(f"data.args: size={size} and input_size={input_size} must be multiples of grid={grid}")
    step = input_size // grid
    side = step if zoom_side is None else zoom_side
    if not dot * input_size / size <= side <= step:
        raise ValueError(f"data.args: zoom_side={zoom_side} must be between the dot's {dot * input_size / size:g} "
                         f"input pixels and the cell's {step}")
    rng = random.Random(seed)
    return {"train": zoom_rows(n_train, size, grid, dot, input_size, side, rng, with_turns=True),
            "eval": zoom_rows(n_eval, size, grid, dot, input_size, side, rng, with_turns=False)}


def zoom_boxes(tool_calls: list[dict] | None, scale: float) -> list[list[float]]:
    """The image-pixel boxes of an episode's zoom calls that ran (input-frame boxes times `scale`)."""
    boxes = []
    for call in tool_calls or []:
        box = call["arguments"].get("bbox_2d") if call["error"] is None else None
        if call["name"] in ("zoom", "crop") and isinstance(box, list) and len(box) == 4:
            boxes.append([float(v) * scale for v in box])
    return boxes


def contains(outer: list[float], inner: list[float]) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and outer[2] >= inner[2] and outer[3] >= inner[3]


def draw_episodes(rows: list[dict], before: list, after: list, out_png: str | Path) -> None:
    """Each held-out image (the dot outlined green) with, before and after RL, the greedy
    episode's first zoom box on it (red, blue), the crop it returned and the answer."""
    from PIL import Image, ImageDraw
    from mmrl.rewards.text import extract_answer
    panels, captions = [], []
    for row, b, a in zip(rows, before, after):
        image = row["images"][0].convert("RGB")
        shown = image.resize((160, 160))
        k = 160 / image.width
        draw = ImageDraw.Draw(shown)
        x1, y1, x2, y2 = (v * k for v in row["dot_box"])
        draw.rectangle([x1 - 4, y1 - 4, x2 + 4, y2 + 4], outline=(0, 160, 0), width=1)  # around the dot, not on it
        panel = Image.new("RGB", (160 + 2 * 84, 160), "white")
        answers = []
        for j, (sample, colour, when) in enumerate(((b, (220, 0, 0), "before"), (a, (0, 0, 230), "after"))):
            boxes = zoom_boxes(sample["tool_calls"], row["scale"])
            if boxes:
                draw.rectangle([v * k for v in boxes[0]], outline=colour, width=2)
                crop = image.crop([int(v) for v in boxes[0]])
                fit = 80 / max(crop.size)  # enlarged or shrunk to 80 pixels, the aspect kept, pixels sharp
                crop = crop.resize((max(1, round(crop.width * fit)), max(1, round(crop.height * fit))), Image.NEAREST)
                panel.paste(crop, (162 + 84 * j, 40))
            answers.append(f"{when} {(extract_answer(sample['text'], 'answer') or '-')[:6]}")
        panel.paste(shown, (0, 0))
        panels.append(panel)
        captions.append(f"dot {row['answer']}; " + ", ".join(answers))  # within the grid's 40 characters
    plot_sample_grid(panels, captions, out_png, ncols=2)
