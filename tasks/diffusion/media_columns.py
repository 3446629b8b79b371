"""The media columns of the diffusion adapter, in and out of a rollout. In: the image a prompt row
brings under `policy.image_column` (the conditioning image of an image-to-video family, the source
image of an editing one), checked with the data before the model loads and read into the
family's conditioning together with the prompt's text, repeated for each rollout of the group.
Out: the columns every completion carries to the rewards besides itself (a video's `fps`; an
audio track's sample rate), which the family declares in `Family.completion_columns`, and what a
completion is (`Family.output`). Before the model loads, the family is the one the pipeline's
configs name (`pipeline_configs`); where they cannot be read, a video is `policy.num_frames` > 1.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .family import Cond, Family
from .pipeline_configs import described_pipeline


def described_family(cfg: Any) -> type[Family] | None:
    """The family of the pipeline `policy.model` names, known before it loads (None: not known)."""
    described = described_pipeline(cfg)
    return described.family if described is not None else None


def completion_kind(cfg: Any) -> str:
    """What a completion is under settings `cfg` (`Policy.output_kind`)."""
    family = described_family(cfg)
    return family.output if family is not None else ("video" if cfg.num_frames > 1 else "image")


def completion_column_names(cfg: Any) -> tuple[str, ...]:
    """The columns a completion carries to the rewards (`Policy.rollout_columns`)."""
    family = described_family(cfg)
    if family is None:
        return ("fps",) if cfg.num_frames > 1 else ()
    return tuple(family.completion_columns(cfg))


def conditioning_columns(cfg: Any) -> dict[str, str]:
    """The conditioning image's column, which every row needs where the family takes one (or where
    `policy.image_column` names one for a pipeline not known before it loads)."""
    family = described_family(cfg)
    if not cfg.image_column or (family is not None and not family.conditioning_image):
        return {}
    return {cfg.image_column: "policy.image_column, the image each prompt is conditioned on"}


def column_checks(cfg: Any) -> dict[str, Callable[[Any], None]]:
    """The columns holding media under settings `cfg` (a `DiffusionConfig`), each with its check
    (`Policy.media_columns`): the conditioning image's, where `policy.image_column` names one (its
    images, as many as the family takes where the pipeline is known before it loads)."""
    from mmrl.data.rows import RowError

    from ..lm.vlm import check_image
    if not cfg.image_column:
        return {}
    family = described_family(cfg)

    def check(value: Any) -> None:
        check_image(value)
        if family is not None and (problem := images_problem(family, value)):
            raise RowError(cfg.image_column, problem)
    return {cfg.image_column: check}


def images_problem(family: type[Family], value: Any) -> str | None:
    """Why a row's conditioning images `value` (one, or a list) are too many for `family`; None if not."""
    count = len(value) if isinstance(value, (list, tuple)) else 1
    most = family.most_conditioning_images
    if count == 0 or (most is not None and count > most):
        return (f"{count} images: {family.__name__} conditions each prompt on "
                f"{'one image' if most == 1 else f'1 to {most} images' if most else 'one image or more'}")
    return None


def condition_images(family: Family, prompts: Sequence[Any], column: str) -> list:
    """The conditioning image of each prompt row (`column`: a path or an image), or its list of
    images where the row lists several (a family that reads several sources)."""
    from ..lm.vlm import load_image
    images = []
    for i, row in enumerate(prompts):
        if not isinstance(row, dict) or row.get(column) is None:
            raise ValueError(f"policy.image_column={column!r}: prompt row {i} has no image in that column")
        if problem := images_problem(type(family), row[column]):
            raise ValueError(f"policy.image_column={column!r}: prompt row {i}: {problem}")
        value = row[column]
        images.append([load_image(v) for v in value] if isinstance(value, (list, tuple)) else load_image(value))
    return images


def prompt_conditioning(family: Family, cfg: Any, prompts: Sequence[Any], texts: list[str],
                        group_size: int) -> Cond:
    """The family's conditioning of each prompt (its text, and its row's image where the family
    takes one), each repeated `group_size` times: [N, ...] per key."""
    images = condition_images(family, prompts, cfg.image_column) if family.conditioning_image else None
    cond = family.condition(texts, images, cfg.classifier_free_guidance)
    return {k: v.repeat_interleave(group_size, 0) for k, v in cond.items()}


def completion_columns(family: Family, cfg: Any, n: int) -> dict[str, list]:
    """The reward columns of `n` completions (`Rollout.columns`): the family's, one value for all."""
    return {key: [value] * n for key, value in family.completion_columns(cfg).items()}
