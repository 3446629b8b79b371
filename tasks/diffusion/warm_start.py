"""The supervised warm start of a diffusion policy (`warm_start.steps`): the denoising loss on the
rows' target images (PIL images or paths; for a video family whose latents are pixels, clips:
lists of frames), each read at the configured size into [-1, 1], encoded to latents by the
family, conditioned on the prompt (and, for a family that takes one, the row's image under
`policy.image_column`: an editing family's source), noised on the family's training process (`Family.noised`: rectified flow, or DDPM for eps
models) and predicted by the denoiser; prompts are dropped to "" with probability
`policy.cfg_dropout` so that classifier-free guidance has an unconditional model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from mmrl.data.images import rgb_image

from .config import DiffusionConfig
from .family import Family
from .media_columns import condition_images


def target_pixels(image: Any, where: str, height: int, width: int) -> Tensor:
    """A target image (PIL or path) as [3, H, W] in [-1, 1] at `height` x `width`."""
    import numpy as np
    from PIL import Image
    if isinstance(image, (str, Path)):
        with Image.open(image) as im:
            image = rgb_image(im, str(image))
    arr = np.asarray(rgb_image(image, where).resize((width, height)), dtype=np.float32)
    return torch.from_numpy(arr).permute(2, 0, 1) / 127.5 - 1


def row_pixels(rows: Sequence[dict], target_column: str, height: int, width: int) -> Tensor:
    """[B, 3, H, W] (images) or [B, 3, T, H, W] (clips) of the rows' `target_column`, on the CPU."""
    pixels = []
    for i, row in enumerate(rows):
        image = row.get(target_column) if isinstance(row, dict) else None
        if image is None:
            raise KeyError(f"warm start: row {i} has no target image column {target_column!r}")
        if isinstance(image, (list, tuple)):  # a clip's frames -> [3, T, H, W]
            pixels.append(torch.stack([target_pixels(f, f"row {i} frame {t}", height, width)
                                       for t, f in enumerate(image)], 1))
        else:
            pixels.append(target_pixels(image, f"row {i}", height, width))
    return torch.stack(pixels)


def denoising_loss(family: Family, cfg: DiffusionConfig, model: nn.Module, rows: Sequence[dict], target_column: str,
                    prompt_of: Callable[[Any], Any], device: torch.device) -> Tensor:
    """The denoising loss of `model` on the rows (module docstring), the prompt of a row `prompt_of(row)`."""
    pixels = row_pixels(rows, target_column, cfg.height, cfg.width)
    with torch.no_grad():
        x0 = family.image_latents(pixels.to(device))
        keep = torch.rand(len(rows)) >= cfg.cfg_dropout
        texts = [str(prompt_of(r)) if k else "" for r, k in zip(rows, keep.tolist())]
        images = condition_images(family, rows, cfg.image_column) if family.conditioning_image else None
        cond = family.condition(texts, images, False)
    x, t, target = family.noised(x0, torch.randn_like(x0), device)
    pred = family.predict(model, x, t, cond, cfg.guidance_scale, False)
    return torch.nn.functional.mse_loss(pred.float(), target.float())
