"""How well an image edit moves the source's content by the shift its instruction asks for
(`edit_shift`), in [0, 1]. The shift v (dx, dy) in pixels (x right, y down) from the source to the
edit is measured by phase correlation of their luminance over the whole image
(`video_motion.phase_shift`: the peak of the normalised cross-power spectrum, sub-pixel), the
source resized to the edit's size first; with e the row's `shift` column (dx, dy), the pixels the
instruction moves the content by ((0, 0): it stays, a recolouring),

    edit_shift = max(0, 1 - |v - e| / tolerance)      (tolerance in pixels, default 4)

so an edit that leaves the content where the instruction moves it scores 0 once the asked shift
is `tolerance` pixels or more. Only where the content goes is scored: pair it with a reward of
what the content is (`colour_shape`, a judge)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from mmrl.core.scoring import register_reward

from .edit_consistency import source_image
from .outputs import IMAGE
from .video_motion import grey, phase_shift


def shift_problem(value: Any, **args) -> str | None:
    """The check of the ``shift`` column before any model loads: a pair of numbers (dx, dy)."""
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        return f"edit_shift: shift {value!r} is not a pair of numbers (dx, dy) in pixels"
    return None


def luminance(image) -> torch.Tensor:
    """A PIL image -> [H, W] luminance in [0, 1]."""
    rgb = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
    return grey(rgb[None])[0]


def measured_shift(source, edit) -> torch.Tensor:
    """[2]: the shift (dx, dy) in pixels that takes the source's content to the edit's."""
    from PIL import Image
    edit = edit.convert("RGB")
    return phase_shift(luminance(source.resize(edit.size, Image.BILINEAR)), luminance(edit))


@register_reward("edit_shift", outputs=IMAGE, check_columns={"shift": shift_problem})
def edit_shift(prompts, completions, image: Sequence, shift: Sequence, tolerance: float = 4.0, **columns):
    if tolerance <= 0:
        raise ValueError(f"edit_shift: tolerance={tolerance} must be > 0")
    out = []
    for edit, source, wanted in zip(completions, image, shift):
        error = float((measured_shift(source_image(source), edit) - torch.tensor(wanted, dtype=torch.float32)).norm())
        out.append(max(0.0, 1.0 - error / tolerance))
    return out
