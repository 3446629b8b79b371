"""Synthetic audio question answering (the R1-AQA shape: multiple choice, accuracy + format):
two sine tones in a clip, "which tone is higher, A (first) or B (second)?"."""

from __future__ import annotations

import random

import numpy as np

from mmrl.registry import DATASETS

RATE = 16000


def tone_pair(rng: random.Random, seconds: float = 0.5, min_gap: int = 20,
              max_gap: int = 1520) -> tuple[np.ndarray, str]:
    """Two tones with a short gap; the answer letter names the higher one. The pitches are
    `min_gap`..`max_gap` Hz apart (a small gap is a hard question)."""
    if not 20 <= min_gap <= max_gap:
        raise ValueError(f"tones: need 20 <= min_gap <= max_gap (Hz); got min_gap={min_gap}, max_gap={max_gap}")
    while True:  # the defaults accept the first draw
        low, high = sorted(rng.sample(range(220, 1760, 20), 2))
        if min_gap <= high - low <= max_gap:
            break
    first_high = rng.random() < 0.5
    freqs = (high, low) if first_high else (low, high)
    t = np.arange(int(RATE * seconds)) / RATE
    gap = np.zeros(RATE // 10, dtype=np.float32)
    clip = np.concatenate([0.3 * np.sin(2 * np.pi * freqs[0] * t), gap, 0.3 * np.sin(2 * np.pi * freqs[1] * t)])
    return clip.astype(np.float32), "A" if first_high else "B"


@DATASETS.register("tones")
def tones(n_train: int = 1000, n_eval: int = 64, seed: int = 0, min_gap: int = 20, max_gap: int = 1520):
    """Rows: {"prompt", "audio": {"array", "sampling_rate"}, "answer": "A" | "B", "target"}; the two
    pitches are `min_gap`..`max_gap` Hz apart (easy and hard curriculum stages)."""
    rng = random.Random(seed)

    def rows(n: int) -> list[dict]:
        out = []
        for _ in range(n):
            clip, answer = tone_pair(rng, min_gap=min_gap, max_gap=max_gap)
            out.append({"prompt": "Which tone is higher? (A) the first (B) the second",
                        "audio": {"array": clip, "sampling_rate": RATE}, "answer": answer,
                        "target": f"<answer>{answer}</answer>"})
        return out

    return {"train": rows(n_train), "eval": rows(n_eval)}


def draw_predictions(rows: list[dict], before: list[str], after: list[str], out_png) -> None:
    """Each held-out clip's spectrogram (two tones: which one is higher?) with its answer and the
    greedy answers before and after RL."""
    from ..figures import draw_transcripts, spectrogram_image
    draw_transcripts([spectrogram_image(r["audio"]["array"], r["audio"]["sampling_rate"]) for r in rows],
                     [r["answer"] for r in rows], before, after, out_png)
