"""The `prompt_enhancer` reward: a frozen text-to-image generator draws each completion, an image
reward scores the drawing (UniRL's prompt-enhancer mode: a language policy learns to write the
prompts a frozen diffusion model draws best).

    rewards:
      prompt_enhancer:
        args:
          generator: {model: ..., eval_num_steps: ..., ...}   # the diffusion adapter's policy settings
          image_reward: clip                                  # any registered image reward
          image_reward_args: {...}

`generator` takes the settings of the diffusion adapter's `policy:` section (any family mmrl
trains: SD3, FLUX, SD 1.5, the pixel demo models); it is loaded once per process, frozen, and
samples greedily (`eval_num_steps` deterministic steps from a noise seeded by `seed` and the
completion's text, so a completion gets the same image in any batch, call or process). The image
reward is called with the rows' prompts (the data set's, not the completions), the images as its
completions, and the rows' data columns.
"""

from __future__ import annotations

import json
import threading
import zlib
from typing import Any

import torch

from mmrl.config.parse import from_dict
from mmrl.core.scoring import bind_reward, register_reward
from mmrl.core.seeding import derive_seed

from .config import DiffusionConfig
from .policy import DiffusionPolicy

_GENERATORS: dict[str, DiffusionPolicy] = {}  # a generator's settings (JSON) -> the loaded, frozen adapter
_LOADING = threading.Lock()


def frozen_generator(settings: dict[str, Any]) -> DiffusionPolicy:
    """The diffusion adapter for `settings` (its `policy:` fields), loaded once and frozen."""
    key = json.dumps(settings, sort_keys=True)
    with _LOADING:
        if key not in _GENERATORS:
            cfg = from_dict(DiffusionConfig, settings, "rewards.prompt_enhancer.args.generator")
            generator = DiffusionPolicy(cfg)
            generator.model.requires_grad_(False).eval()
            _GENERATORS[key] = generator
        return _GENERATORS[key]


def text_seed(seed: int, text: str) -> int:
    """The noise seed of a completion: `seed` and the text's CRC-32."""
    return derive_seed(seed, zlib.crc32(text.encode()))


def draw(generator: DiffusionPolicy, texts: list[str], seed: int) -> list[Any]:
    """One greedy image per text."""
    with torch.no_grad():
        return list(generator.rollout(texts, 1, [text_seed(seed, t) for t in texts], greedy=True).completions)


@register_reward("prompt_enhancer", outputs=("text",))
def prompt_enhancer(prompts, completions, generator: dict[str, Any], image_reward: str,
                    image_reward_args: dict[str, Any] | None = None, seed: int = 0, **columns):
    """`image_reward`'s score of the image the frozen `generator` draws from each completion."""
    images = draw(frozen_generator(generator), [str(c) for c in completions], seed)
    return bind_reward(image_reward, image_reward_args)(prompts=list(prompts), completions=images, **columns)
