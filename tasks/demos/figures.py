"""Demo figures for text outputs: each held-out input (an image, or a spectrogram of a clip) with
the reference and the greedy outputs before and after RL written under it, in a PNG grid."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from mmrl.train.reporting.tracking import plot_sample_grid

PANEL_WIDTH = 320


def text_panel(image, lines: Sequence[str]):
    """`image` (PIL) scaled to the panel width, with one line of text per entry below it."""
    from PIL import Image, ImageDraw
    image = image.convert("RGB")
    scale = min(PANEL_WIDTH / image.width, 120 / image.height)
    image = image.resize((max(1, int(image.width * scale)), max(1, int(image.height * scale))))
    line_h = 14
    panel = Image.new("RGB", (PANEL_WIDTH, image.height + 8 + line_h * len(lines)), "white")
    panel.paste(image, ((PANEL_WIDTH - image.width) // 2, 0))
    draw = ImageDraw.Draw(panel)
    for k, line in enumerate(lines):
        draw.text((4, image.height + 4 + k * line_h), line[:52], fill=(0, 0, 0))
    return panel


def spectrogram_image(samples: np.ndarray, rate: int, max_hz: float = 3000, n_fft: int = 512, hop: int = 128):
    """A log-magnitude spectrogram up to `max_hz` (low frequencies at the bottom), 4 pixels per
    frame, as a grayscale PIL image."""
    from PIL import Image
    frames = np.lib.stride_tricks.sliding_window_view(samples, n_fft)[::hop] * np.hanning(n_fft)
    power = np.log1p(100 * np.abs(np.fft.rfft(frames, axis=1)).T[: int(max_hz * n_fft / rate)][::-1])
    image = Image.fromarray((255 * (1 - power / max(power.max(), 1e-9))).astype(np.uint8))
    return image.resize((4 * image.width, image.height))


def draw_transcripts(inputs: Sequence, references: Sequence[str], before: Sequence[str], after: Sequence[str],
                     out_png: str | Path) -> None:
    panels = [text_panel(image, [f"reference: {ref}", f"before RL: {b.strip()}", f"after RL:  {a.strip()}"])
              for image, ref, b, a in zip(inputs, references, before, after)]
    plot_sample_grid(panels, [""] * len(panels), out_png, ncols=2)
