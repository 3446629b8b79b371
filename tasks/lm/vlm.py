"""Vision-language models as policies: any ``AutoModelForImageTextToText`` with its
``AutoProcessor`` (Qwen2.5-VL, Qwen2-VL, Qwen3-VL, LLaVA-style, Gemma 3); images from paths or
PIL images in the data set's `image_column`, videos (paths decoded with PyAV, or frames; see
`tasks.video_clips`) in its `video_column`, one or a list per row.

T-GRPO (Video-R1): with `shuffled_rollouts: S > 0`, each prompt with a video is also rolled out S
times with its frames shuffled (one permutation per group, drawn from the group's seed). Those
rows are auxiliary (`Rollout.auxiliary`): the rewards score them, the `t_grpo` reward compares a
group's accuracy with and without order, and the engine then drops them, so they take no part
in the loss. Video-R1 trains only on the ordered rollouts too: the shuffled ones answer a
different question (the same video without its order), and their likelihood under the policy is
not what the bonus asks to raise.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from mmrl.core.rollout import Rollout
from mmrl.core.seeding import derive_seed
from mmrl.data import RowError
from mmrl.data.images import rgb_image
from mmrl.registry import ADAPTERS

from ..model_loading import DTYPES, pretrained
from .causal_lm import CausalLMConfig
from .multimodal import MultimodalPolicy, column_values
from .qwen_vl_positions import use_released_positions
from .vlm_memory_formula import VisionLanguageMemory, vision_language_memory
from .video_clips import Clip, check_video, is_single_video, load_video, shuffled_order

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
    """A PIL image in RGB (`mmrl.data.images.rgb_image`: 16-bit scaled, transparency on white) from a
    path, a PIL image, raw bytes or a ``{"bytes", "path"}`` dict (a Hugging Face image value; bytes
    first); a broken file fails naming its path."""
    from PIL import Image, UnidentifiedImageError
    if isinstance(image, Image.Image):
        return rgb_image(image, "<PIL image>")
    source = _image_source(image)
    try:
        with Image.open(source) as im:
            return rgb_image(im, _image_name(image))
    except (FileNotFoundError, UnidentifiedImageError, OSError) as e:
        raise ValueError(f"image {_image_name(image)!r} cannot be read: {e}") from e


def _image_source(image: Any) -> Any:
    """What `PIL.Image.open` reads for an image value: a path or a byte stream."""
    if isinstance(image, dict) and ("bytes" in image or "path" in image):
        image = image.get("bytes") or image.get("path")
    if isinstance(image, (bytes, bytearray)):
        return io.BytesIO(image)
    if isinstance(image, (str, Path)):
        return image
    raise TypeError(f"an image must be a path, a PIL image, bytes or {{'bytes', 'path'}}, got {type(image).__name__}")


def _image_name(image: Any) -> str:
    if isinstance(image, dict):
        return str(image.get("path") or "<bytes>")
    return "<bytes>" if isinstance(image, (bytes, bytearray)) else str(image)


def _image_size(images: list) -> list[int] | None:
    """[width, height] of the first image (read from its header), None without one."""
    from PIL import Image
    if not images:
        return None
    if isinstance(images[0], Image.Image):
        return list(images[0].size)
    with Image.open(_image_source(images[0])) as im:
        return list(im.size)


def check_image(value: Any) -> None:
    """Raise `RowError` unless every image of a column value (one or a list) opens and its data
    passes PIL's integrity check (`verify`: no full decode; 32-bit integer and float images are
    decoded, their values checked against what `rgb_image` converts)."""
    from PIL import Image
    for image in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(image, Image.Image):
            continue
        try:
            source = _image_source(image)
        except TypeError as e:
            raise RowError(None, "not an image", str(e)) from None
        if isinstance(source, (str, Path)) and not Path(source).is_file():
            raise RowError(None, "image file does not exist", str(source))
        try:
            with Image.open(source) as im:
                im.verify()
                mode = im.mode
        except Exception as e:
            raise RowError(None, "image cannot be decoded", f"{_image_name(image)}: {e}") from None
        if mode in ("I", "F"):  # 32-bit integer / float pixels: their range is known only from the pixels
            try:
                load_image(image)
            except ValueError as e:
                raise RowError(None, "image values out of range", str(e)) from None


@ADAPTERS.register("vlm")
class VLMPolicy(MultimodalPolicy):
    Config = VLMConfig
    rollout_engines = ("hf", "vllm")

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

    @classmethod
    def memory_model(cls, cfg: VLMConfig, prompt_length: int) -> VisionLanguageMemory:
        """Qwen2-VL and Qwen2.5-VL (tasks/lm/vlm_memory_formula.py): one image per prompt at the
        processor's pixel bound; other vision towers are refused by name."""
        return vision_language_memory(cfg, prompt_length)

    @classmethod
    def media_columns(cls, cfg: VLMConfig) -> dict[str, Any]:
        return {cfg.image_column: check_image, cfg.video_column: check_video}

    @classmethod
    def rollout_columns(cls, cfg: VLMConfig) -> tuple[str, ...]:
        return (*super().rollout_columns(cfg), "original_size", "input_size")  # `_add_image_sizes`

    def _load(self, cfg: VLMConfig) -> None:
        super()._load(cfg)
        use_released_positions(self.model)  # Qwen2-VL / Qwen2.5-VL: the positions vLLM and the released models use

    def _load_pretrained(self, cfg: VLMConfig) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor
        kwargs = {k: v for k, v in (("min_pixels", cfg.min_pixels), ("max_pixels", cfg.max_pixels)) if v}
        self.processor = AutoProcessor.from_pretrained(cfg.tokenizer or cfg.model,
                                                       trust_remote_code=cfg.trust_remote_code, **kwargs)
        self.model = pretrained(AutoModelForImageTextToText, cfg.model, dtype=DTYPES[cfg.dtype],
                                attn_implementation=cfg.attn_implementation, trust_remote_code=cfg.trust_remote_code)

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
        out = self._rollout(prompts, group_size, seeds, greedy)
        self._add_image_sizes(out, prompts)
        return out

    def _add_image_sizes(self, rollout: Rollout, prompts: Sequence[Any]) -> None:
        """Columns for box rewards: each row's first image's `original_size` and its `input_size`
        as the processor resized it ([width, height]; None for a row without an image). The
        input size is the patch grid times the patch size (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), else
        the pixel tensor's size."""
        originals = [_image_size(column_values(p, self.cfg.image_column)) for p in prompts]
        grids, pixels = rollout.extras.get("image_grid_thw"), rollout.extras.get("pixel_values")
        patch = getattr(getattr(self.processor, "image_processor", None), "patch_size", None)
        inputs = []
        for r, g in enumerate(rollout.group_id.tolist()):
            if originals[g] is None:
                inputs.append(None)
            elif grids is not None and patch and len(grids[r]):
                _, h, w = (int(v) for v in grids[r][0])
                inputs.append([w * patch, h * patch])
            elif pixels is not None and len(pixels[r]) and pixels[r].dim() == 4:
                inputs.append([int(pixels[r].shape[-1]), int(pixels[r].shape[-2])])
            else:
                inputs.append(None)
        rollout.columns.setdefault("original_size", [originals[g] for g in rollout.group_id.tolist()])
        rollout.columns.setdefault("input_size", inputs)

    def _rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int], greedy: bool) -> Rollout:
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
