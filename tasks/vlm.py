"""Vision-language models as policies: any ``AutoModelForImageTextToText`` with its
``AutoProcessor`` (Qwen2.5-VL, Qwen2-VL, Qwen3-VL, LLaVA-style, Gemma 3); images from paths or
PIL images in the data set's `image_column`, videos (paths decoded with PyAV, or frames; see
`tasks.video`) in its `video_column`, one or a list per row.

T-GRPO (Video-R1): with `shuffled_rollouts: S > 0`, each prompt with a video is also rolled out S
times with its frames shuffled (one permutation per group, drawn from the group's seed). Those
rows are auxiliary (`Rollout.auxiliary`): the rewards score them, the `t_grpo` reward compares a
group's accuracy with and without order, and the engine then drops them, so they take no part
in the loss. Video-R1 trains only on the ordered rollouts too: the shuffled ones answer a
different question (the same video without its order), and their likelihood under the policy is
not what the bonus asks to raise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from mmrl.registry import ADAPTERS
from mmrl.rollout import Rollout
from mmrl.sampling import derive_seed

from .causal_lm import DTYPES, CausalLMConfig
from .multimodal import MultimodalPolicy, column_values
from .video import Clip, is_single_video, load_video, shuffled_order

SHUFFLE_SALT = 0x5B0F


@dataclass
class VLMConfig(CausalLMConfig):
    """`num_frames` / `fps` / `max_frames`: how a video's frames are sampled (`sample_indices`);
    `video_min_pixels` / `video_max_pixels`: the video processor's per-frame size bounds;
    `shuffled_rollouts`: T-GRPO's rollouts per prompt with shuffled frames (Video-R1 uses half the
    group; 0: off)."""

    image_column: str = field(default="image", metadata={"help": (
        "The data-set column holding each prompt's image(s): a path, a PIL image, or a list.")})
    min_pixels: int | None = field(default=None, metadata={"help": (
        "The image processor's lower bound on pixels per image (Qwen2-VL-style processors); null: the processor's "
        "default.")})
    max_pixels: int | None = field(default=None, metadata={"help": (
        "The image processor's upper bound on pixels per image; null: the processor's default.")})
    video_column: str = field(default="video", metadata={"help": (
        "The data-set column holding each prompt's video: a path (read with PyAV), a list of frames, or {frames, "
        "fps}.")})
    num_frames: int | None = field(default=None, metadata={"help": (
        "Sample this many frames evenly spaced over a video; give num_frames or fps, not both; null with fps "
        "null: every frame.")})
    fps: float | None = field(default=None, metadata={"help": (
        "Sample frames at this rate (frames per second of video); give num_frames or fps, not both.")})
    max_frames: int | None = field(default=32, metadata={"help": (
        "More sampled frames than this are thinned to this many evenly spaced ones; null: no limit.")})
    video_min_pixels: int | None = field(default=None, metadata={"help": (
        "The video processor's per-frame lower size bound; null: the processor's default.")})
    video_max_pixels: int | None = field(default=None, metadata={"help": (
        "The video processor's per-frame upper size bound; null: the processor's default.")})
    shuffled_rollouts: int = field(default=0, metadata={"help": (
        "T-GRPO (Video-R1): extra rollouts per prompt that see the video's frames shuffled; the t_grpo reward "
        "compares them with the ordered ones; they never train (Video-R1 uses half the group). 0: off.")})


def load_image(image: Any):
    """A PIL image in RGB from a path or a PIL image; a broken file fails naming its path."""
    from PIL import Image, UnidentifiedImageError
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, (str, Path)):
        try:
            with Image.open(image) as im:
                return im.convert("RGB")
        except (FileNotFoundError, UnidentifiedImageError, OSError) as e:
            raise ValueError(f"image {str(image)!r} cannot be read: {e}") from e
    raise TypeError(f"an image must be a path or a PIL image, got {type(image).__name__}")


@ADAPTERS.register("vlm")
class VLMPolicy(MultimodalPolicy):
    Config = VLMConfig

    def __init__(self, cfg: VLMConfig):
        if cfg.num_frames is not None and cfg.fps is not None:
            raise ValueError(f"policy.num_frames={cfg.num_frames} and policy.fps={cfg.fps}: give one of them")
        for name in ("num_frames", "fps", "max_frames"):
            value = getattr(cfg, name)
            if value is not None and not value > 0:
                raise ValueError(f"policy.{name}={value} must be > 0")
        if cfg.shuffled_rollouts < 0:
            raise ValueError(f"policy.shuffled_rollouts={cfg.shuffled_rollouts} must be >= 0")
        super().__init__(cfg)

    def _load_pretrained(self, cfg: VLMConfig) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor
        kwargs = {k: v for k, v in (("min_pixels", cfg.min_pixels), ("max_pixels", cfg.max_pixels)) if v}
        self.processor = AutoProcessor.from_pretrained(cfg.tokenizer or cfg.model,
                                                       trust_remote_code=cfg.trust_remote_code, **kwargs)
        self.model = AutoModelForImageTextToText.from_pretrained(
            cfg.model, dtype=DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation,
            trust_remote_code=cfg.trust_remote_code)

    def _clips(self, row: Any) -> list[Clip]:
        """The row's videos, decoded and sampled."""
        cfg = self.cfg
        if not isinstance(row, dict) or row.get(cfg.video_column) is None:
            return []
        value = row[cfg.video_column]
        videos = [value] if is_single_video(value) else list(value)
        return [load_video(v, cfg.num_frames, cfg.fps, cfg.max_frames) for v in videos]

    def _media(self, row: Any) -> tuple[list[dict], dict[str, Any]]:
        cfg = self.cfg
        images = [load_image(v) for v in column_values(row, cfg.image_column)]
        media: dict[str, Any] = {"images": images or None}
        clips = self._clips(row)
        if clips:
            # the frames are sampled already: the processor must not sample them again
            media.update(videos=[c.frames for c in clips], video_metadata=[c.metadata() for c in clips],
                         videos_kwargs={"do_sample_frames": False})
            size = {k: v for k, v in (("shortest_edge", cfg.video_min_pixels),
                                      ("longest_edge", cfg.video_max_pixels)) if v}
            if size:
                media["videos_kwargs"]["size"] = size
        return [{"type": "image"} for _ in images] + [{"type": "video"} for _ in clips], media

    @torch.no_grad()
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int],
                greedy: bool = False) -> Rollout:
        """The group's rollouts; with `shuffled_rollouts`, each group with a video is followed by
        its auxiliary rows, drawn with the frames of every video in the row shuffled."""
        shuffled = self.cfg.shuffled_rollouts
        if not shuffled:
            return super().rollout(prompts, group_size, seeds, greedy)
        rows = [{**p, self.cfg.video_column: self._clips(p)} if isinstance(p, dict) else p for p in prompts]
        ordered = super().rollout(rows, group_size, seeds, greedy)
        ordered.auxiliary = torch.zeros(len(ordered), dtype=torch.bool)
        with_video = [g for g, row in enumerate(rows) if isinstance(row, dict) and row[self.cfg.video_column]]
        if not with_video:
            return ordered
        shuffled_rows, shuffled_seeds = [], []
        for g in with_video:
            generator = torch.Generator().manual_seed(derive_seed(seeds[g], SHUFFLE_SALT))
            clips = [c.permuted(shuffled_order(len(c.frames), generator)) for c in rows[g][self.cfg.video_column]]
            shuffled_rows.append({**rows[g], self.cfg.video_column: clips})
            shuffled_seeds.append(derive_seed(seeds[g], SHUFFLE_SALT, 1))
        contrast = super().rollout(shuffled_rows, shuffled, shuffled_seeds, greedy)
        contrast.group_id = torch.tensor(with_video).repeat_interleave(shuffled)
        contrast.auxiliary = torch.ones(len(contrast), dtype=torch.bool)
        both = self.concat([ordered, contrast])
        return both.select(torch.argsort(both.group_id, stable=True))  # each group's block: ordered, then shuffled
