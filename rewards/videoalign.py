"""VideoAlign / VideoReward (Liu et al. 2025, "Improving Video Generation with Human Feedback"):
a Qwen2-VL reward model with three heads, visual quality (VQ), motion quality (MQ) and text
alignment (TA), each the reward head on the hidden state of its special token in the prompt.

    videoalign       `head`: VQ, MQ, TA or overall (VQ + MQ + TA, as the authors' `Overall`)
    videoalign_vq / videoalign_mq / videoalign_ta   one head each, so that with
                     `reward_combine: advantage` each dimension has its own advantage (DanceGRPO
                     trains HunyuanVideo on VQ and MQ this way); the three share one model
                     forward per batch

With `normalise: true` (the authors' `use_norm`) a head's score is (raw - mean) / std with the
checkpoint's `inference_config` (model_config.json), or, where the file has none, the constants
published with the VideoReward checkpoint (`PUBLISHED_NORMALISATION`).

The prompt is the one the checkpoint was trained with (VideoAlign's `detailed_special` template).
mmrl does not ship it: it is read from `args.template` (a text file) or, by default,
`prompt_template.txt` in the checkpoint directory; it must hold `{text_prompt}` (the video's prompt)
and each head's special token once (`prompt_template`).

Frames as the authors' reader prepares them: from a video of T frames at the row's `fps` column
(`source_fps` where the data has none), n = round_2(clamp(T / fps x sample_fps, 4, T)) frames
taken at round(linspace(0, T - 1, n)) (`sample_fps`: the checkpoint's `data_config.fps`, 2),
resized bicubically to the multiple of 28 nearest each side within [min_pixels, max_pixels]
(`max_pixels`: the checkpoint's `data_config.max_frame_pixels`).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from mmrl.core.scoring import register_reward

from .clip import _device, _prompt_text
from .outputs import VIDEO
from .video_frames import frame_tensor
from .videoalign_checkpoint import VideoAlignModel, load_videoalign

HEADS = ("VQ", "MQ", "TA")
PUBLISHED_NORMALISATION = {"VQ": (3.6757, 2.2476), "MQ": (1.1646, 1.3811), "TA": (2.8105, 2.5121)}
PATCH = 28  # the Qwen2-VL vision patch (14) times its 2 x 2 merge
MIN_PIXELS = 128 * PATCH * PATCH


def normalisation(settings: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """head -> (mean, std) from the checkpoint's inference_config, else the published constants."""
    found = settings.get("inference_config") or {}
    if all(f"{h}_mean" in found and f"{h}_std" in found for h in HEADS):
        return {h: (float(found[f"{h}_mean"]), float(found[f"{h}_std"])) for h in HEADS}
    return dict(PUBLISHED_NORMALISATION)


def sampled_frames(num_frames: int, fps: float, sample_fps: float) -> list[int]:
    """The frame indices the authors' uniform sampling takes (module docstring)."""
    ceiling = 2 * (num_frames // 2)
    if ceiling < 2:
        raise ValueError(f"videoalign needs videos of at least 2 frames; got {num_frames}")
    wanted = min(max(num_frames / fps * sample_fps, 4), ceiling)
    n = min(2 * round(wanted / 2), num_frames)
    return torch.linspace(0, num_frames - 1, n).round().long().tolist()


def resized_side(height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(h, w): multiples of 28 near (height, width) with h w in [min_pixels, max_pixels]."""
    h, w = max(PATCH, PATCH * round(height / PATCH)), max(PATCH, PATCH * round(width / PATCH))
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = PATCH * math.floor(height / beta / PATCH), PATCH * math.floor(width / beta / PATCH)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = PATCH * math.ceil(height * beta / PATCH), PATCH * math.ceil(width * beta / PATCH)
    return h, w


def prepared_video(video: Any, fps: float, sample_fps: float, min_pixels: int, max_pixels: int) -> torch.Tensor:
    """[n, 3, h, w] float in 0..255: the sampled, resized frames."""
    frames = frame_tensor(video)
    frames = frames[sampled_frames(frames.shape[0], fps, sample_fps)]
    if frames.shape[1] == 1:
        frames = frames.expand(-1, 3, -1, -1)
    size = resized_side(frames.shape[-2], frames.shape[-1], min_pixels, max_pixels)
    return F.interpolate(frames * 255, size=size, mode="bicubic", antialias=True, align_corners=False)


TEMPLATE_FILE = "prompt_template.txt"


@functools.lru_cache(maxsize=4)
def prompt_template(path: str, template: str | None) -> str:
    """The checkpoint's prompt template: the file `template`, else `path`/prompt_template.txt;
    checked for the `{text_prompt}` field and one special token per head."""
    from .videoalign_checkpoint import SPECIAL_TOKENS
    file = Path(template) if template else Path(path) / TEMPLATE_FILE
    if not file.is_file():
        raise ValueError(
            f"videoalign needs the prompt its checkpoint was trained with, and {str(file)!r} does not exist: save "
            f"the `detailed_special` template of VideoAlign's prompt_template.py (KwaiVGI/VideoAlign) as "
            f"{TEMPLATE_FILE} in the checkpoint directory, or pass args.template=FILE")
    text = file.read_text()
    missing = [t for t in ("{text_prompt}", *SPECIAL_TOKENS.values()) if text.count(t) != 1]
    if missing:
        raise ValueError(f"videoalign: the template {str(file)!r} must hold each of {missing} exactly once")
    return text


@torch.no_grad()
def raw_scores(reward_model: VideoAlignModel, prompts: list[str], videos: list[torch.Tensor],
               template: str) -> torch.Tensor:
    """[B, 3] the heads' raw scores (VQ, MQ, TA) of prepared videos, asked with `template`."""
    processor = reward_model.processor
    chats = [[{"role": "user", "content": [{"type": "video"}, {
        "type": "text", "text": template.replace("{text_prompt}", p)}]}] for p in prompts]
    texts = [processor.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    batch = processor(text=texts, videos=videos, padding=True, return_tensors="pt",
                      videos_kwargs={"do_rescale": True, "do_resize": False})
    device = reward_model.rm_head.weight.device
    batch = {k: v.to(device) for k, v in batch.items() if torch.is_tensor(v)}
    hidden = reward_model.model.model(**batch).last_hidden_state
    logits = reward_model.rm_head(hidden.to(reward_model.rm_head.weight.dtype)).float()  # [B, L, out]
    columns = []
    for index, head in enumerate(HEADS):
        at = batch["input_ids"] == reward_model.token_ids[head]
        if not (at.sum(1) == 1).all():
            raise ValueError(f"videoalign: each prompt must hold one {head} reward token")
        row_logits = logits[at]  # [B, out] in row order
        columns.append(row_logits[:, index if row_logits.shape[1] == len(HEADS) else 0])
    return torch.stack(columns, 1)


_load = functools.lru_cache(maxsize=2)(load_videoalign)
_last_batch: dict[str, Any] = {}


def head_scores(prompts, completions, path, base, template, fps, source_fps, sample_fps, min_pixels, max_pixels,
                normalise, device, dtype, batch_size) -> dict[str, list[float]]:
    """head -> scores of the batch (VQ, MQ, TA and overall); the last batch is kept, so the three
    one-head rewards run the model once."""
    if not path:
        raise ValueError("videoalign needs args.path: the VideoReward checkpoint directory")
    template_text = prompt_template(path, template)
    settings = (path, base, template, fps, source_fps, sample_fps, min_pixels, max_pixels, normalise, device, dtype, batch_size)
    cached = _last_batch.get("key")
    if cached and cached[0] == settings and len(cached[1]) == len(completions) and \
            all(a is b for a, b in zip(cached[1], completions)) and cached[2] == list(prompts):
        return _last_batch["scores"]
    model = _load(path, base, _device(device), getattr(torch, dtype))
    data = model.settings.get("data_config", {})
    sample_fps = sample_fps or data.get("fps", 2.0)
    max_pixels = max_pixels or data.get("max_frame_pixels", 448 * 448)
    if fps is None and not source_fps:
        raise ValueError("videoalign needs the frame rate: a column 'fps' or args.source_fps")
    rates = fps if fps is not None else [source_fps] * len(completions)
    raw = []
    for i in range(0, len(completions), batch_size):
        videos = [prepared_video(v, float(r), sample_fps, min_pixels, max_pixels)
                  for v, r in zip(completions[i:i + batch_size], rates[i:i + batch_size])]
        raw.append(raw_scores(model, [_prompt_text(p) for p in prompts[i:i + batch_size]], videos, template_text))
    raw = torch.cat(raw)
    if normalise:
        stats = normalisation(model.settings)
        raw = torch.stack([(raw[:, j] - stats[h][0]) / stats[h][1] for j, h in enumerate(HEADS)], 1)
    scores = {h: raw[:, j].tolist() for j, h in enumerate(HEADS)}
    scores["overall"] = raw.sum(1).tolist()
    _last_batch.update(key=(settings, list(completions), list(prompts)), scores=scores)
    return scores


def _videoalign_reward(fixed_head: str | None):
    def reward(prompts, completions, path: str | None = None, base: str | None = None, template: str | None = None,
               fps=None,
               source_fps: float | None = None, sample_fps: float | None = None, min_pixels: int = MIN_PIXELS,
               max_pixels: int | None = None, normalise: bool = True, device: str | None = None,
               dtype: str = "bfloat16", batch_size: int = 1, head: str = fixed_head or "overall", **columns):
        if head not in (*HEADS, "overall") or (fixed_head and head != fixed_head):
            raise ValueError(f"videoalign: head={head!r} is not one of VQ, MQ, TA, overall"
                             if not fixed_head else f"videoalign_{fixed_head.lower()} scores head {fixed_head} only")
        return head_scores(prompts, completions, path, base, template, fps, source_fps, sample_fps, min_pixels, max_pixels,
                           normalise, device, dtype, batch_size)[head]
    reward.__annotations__["head"] = Literal[(fixed_head,) if fixed_head else (*HEADS, "overall")]  # its choices
    return reward


videoalign = register_reward("videoalign", outputs=VIDEO)(_videoalign_reward(None))
videoalign_vq = register_reward("videoalign_vq", outputs=VIDEO)(_videoalign_reward("VQ"))
videoalign_mq = register_reward("videoalign_mq", outputs=VIDEO)(_videoalign_reward("MQ"))
videoalign_ta = register_reward("videoalign_ta", outputs=VIDEO)(_videoalign_reward("TA"))
