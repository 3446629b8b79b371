"""The media columns of the diffusion adapter, in and out of a rollout. In: the image a prompt row
brings under `policy.image_column` (the conditioning image of an image-to-video family, the source
image of an editing one), checked with the data before the model loads and read into the
family's conditioning together with the prompt's text, repeated for each rollout of the group.
Out: the columns every completion carries to the rewards besides itself (a video's `fps`; an
audio track's sample rate), which the family declares in `Family.completion_columns`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .family import Cond, Family


def column_checks(cfg: Any) -> dict[str, Callable[[Any], None]]:
    """The columns holding media under settings `cfg` (a `DiffusionConfig`), each with its check
    (`Policy.media_columns`): the conditioning image's, where `policy.image_column` names one."""
    from ..lm.vlm import check_image
    return {cfg.image_column: check_image} if cfg.image_column else {}


def condition_images(prompts: Sequence[Any], column: str) -> list:
    """The conditioning image of each prompt row (`column`: a path or an image)."""
    from ..lm.vlm import load_image
    images = []
    for i, row in enumerate(prompts):
        if not isinstance(row, dict) or row.get(column) is None:
            raise ValueError(f"policy.image_column={column!r}: prompt row {i} has no image in that column")
        images.append(load_image(row[column]))
    return images


def prompt_conditioning(family: Family, cfg: Any, prompts: Sequence[Any], texts: list[str],
                        group_size: int) -> Cond:
    """The family's conditioning of each prompt (its text, and its row's image where the family
    takes one), each repeated `group_size` times: [N, ...] per key."""
    cond = family.encode(texts, cfg.classifier_free_guidance)
    if family.conditioning_image:
        cond.update(family.image_condition(condition_images(prompts, cfg.image_column)))
    return {k: v.repeat_interleave(group_size, 0) for k, v in cond.items()}


def completion_columns(family: Family, cfg: Any, n: int) -> dict[str, list]:
    """The reward columns of `n` completions (`Rollout.columns`): the family's, one value for all."""
    return {key: [value] * n for key, value in family.completion_columns(cfg).items()}
