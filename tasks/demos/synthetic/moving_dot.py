"""Synthetic video question answering where frame order matters: a dot crosses the frame, "which
way does the dot move?" (A) left (B) right (C) up (D) down. With the frames shuffled the
direction cannot be told (T-GRPO's contrast)."""

from __future__ import annotations

import random
import zlib

import numpy as np

from mmrl.registry import DATASETS

DIRECTIONS = {"A": (-1, 0), "B": (1, 0), "C": (0, -1), "D": (0, 1)}  # (dx, dy); y grows downwards
NAMES = {"A": "left", "B": "right", "C": "up", "D": "down"}
QUESTION = "Which way does the dot move? (A) left (B) right (C) up (D) down"
FPS = 4.0


def dot_clip(direction: str, frames: int, size: int, rng: random.Random) -> np.ndarray:
    """[frames, size, size, 3] uint8: a square dot of side size // 7 stepping evenly across the
    frame along `direction`, from a random point on the perpendicular axis and a random colour."""
    dx, dy = DIRECTIONS[direction]
    side = max(size // 7, 2)
    span = size - side
    start, end = (0, span) if dx + dy > 0 else (span, 0)
    across = rng.randint(0, span)
    colour = [rng.randint(0, 160) for _ in range(3)]
    clip = np.full((frames, size, size, 3), 235, dtype=np.uint8)
    for t in range(frames):
        along = round(start + (end - start) * t / max(frames - 1, 1))
        x, y = (along, across) if dx else (across, along)
        clip[t, y:y + side, x:x + side] = colour
    return clip


@DATASETS.register("moving_dot")
def moving_dot(n_train: int = 1000, n_eval: int = 64, frames: int = 8, size: int = 56, seed: int = 0):
    """Rows: {"prompt", "video": {"frames": [T, H, W, 3] uint8, "fps": 4}, "answer": letter,
    "target": "<answer>letter</answer>"}; directions drawn uniformly."""
    rng = random.Random(seed)

    def rows(n: int) -> list[dict]:
        out = []
        for _ in range(n):
            answer = rng.choice(sorted(DIRECTIONS))
            out.append({"prompt": QUESTION, "video": {"frames": dot_clip(answer, frames, size, rng), "fps": FPS},
                        "answer": answer, "target": f"<answer>{answer}</answer>"})
        return out

    return {"train": rows(n_train), "eval": rows(n_eval)}


def shuffled_frames(row: dict) -> dict:
    """The row with its clip's frames in a random order (fixed per clip: seeded by its pixels), the
    held-out variant on which a model that reads frame order drops to chance."""
    frames = np.asarray(row["video"]["frames"])
    order = np.random.default_rng(zlib.crc32(frames.tobytes())).permutation(len(frames))
    return {**row, "video": {**row["video"], "frames": frames[order]}}


def motion_trail(frames: np.ndarray):
    """One PIL image of a clip: each frame's dot drawn over the first frame, later frames darker,
    so the direction reads at a glance."""
    from PIL import Image
    frames = np.asarray(frames, dtype=np.float32)
    background = np.median(frames, axis=0)
    trail = np.full(frames.shape[1:], 255.0)
    for t, frame in enumerate(frames):
        moved = np.abs(frame - background).sum(-1) > 30
        trail[moved] = 200 * (1 - (t + 1) / len(frames))
    return Image.fromarray(trail.astype(np.uint8))


def draw_predictions(rows: list[dict], before: list[str], after: list[str], out_png) -> None:
    """Each held-out clip as a motion trail (the dot darkens as it moves), with its answer and the
    greedy answers before and after RL."""
    from ..figures import draw_transcripts
    draw_transcripts([motion_trail(r["video"]["frames"]) for r in rows],
                     [f"{r['answer']} ({NAMES[r['answer']]})" for r in rows],
                     before, after, out_png)
