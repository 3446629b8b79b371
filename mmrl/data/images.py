"""An image made RGB for a model without losing what it shows.

PIL's ``convert("RGB")`` clips 16-bit pixels to 255 (a 16-bit PNG becomes white) and drops an
alpha channel. Here 16-bit integer images (modes ``I;16``, ``I;16B``, ``I;16L``, ``I;16N``, and
``I`` with values in 0..65535) are scaled to 8 bits, value v -> round(v / 257) (so 65535 -> 255);
float images (``F``) with values in [0, 1] are scaled by 255; other ``I`` / ``F`` values are
refused. An image with transparency (``RGBA``, ``LA``, ``PA``, a palette or grey image with a
transparent colour) is composited on white, and the first one of a process is noted in the log.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

logger = logging.getLogger("mmrl")

SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")
ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")
BACKGROUND = (255, 255, 255)  # what a transparent pixel shows
_noted_transparency: list[str] = []  # the first image with transparency, once noted


def _eight_bit(image: Any, name: str) -> Any:
    """A grey 8-bit (``L``) image from a 16-bit integer or float one."""
    from PIL import Image
    values = np.asarray(image, dtype=np.float64)
    if image.mode == "F":
        low, high, scale = 0.0, 1.0, 255.0
    else:
        low, high, scale = 0, 65535, 1 / 257
    if values.size and (values.min() < low or values.max() > high):
        raise ValueError(f"image {name!r}: mode {image.mode} values span {values.min():g}..{values.max():g}, "
                         f"outside {low:g}..{high:g}; save it as an 8- or 16-bit image")
    return Image.fromarray(np.rint(values * scale).astype(np.uint8), mode="L")


def _has_transparency(image: Any) -> bool:
    return image.mode in ALPHA_MODES or (image.mode in ("P", "L", "RGB") and "transparency" in image.info)


def rgb_image(image: Any, name: str) -> Any:
    """`image` (a PIL image) as an 8-bit RGB one; `name` (its path, say) is what errors and the note say."""
    from PIL import Image
    if image.mode in SIXTEEN_BIT_MODES or image.mode in ("I", "F"):
        return _eight_bit(image, name).convert("RGB")
    if _has_transparency(image):
        if not _noted_transparency:
            _noted_transparency.append(name)
            logger.warning("image %r (mode %s) has transparency: images with transparency are composited on "
                           "white (docs/data.md); noted once", name, image.mode)
        background = Image.new("RGBA", image.size, BACKGROUND + (255,))
        return Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")
