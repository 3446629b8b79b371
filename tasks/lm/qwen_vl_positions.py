"""Multimodal rotary positions of Qwen2-VL and Qwen2.5-VL in the convention the released models
were trained with, which vLLM and verl follow: after an image or a video, the text resumes at the
largest position of that block + 1 (over its temporal, height and width positions).

transformers 5 (5.19 and 5.24 checked) resumes it at the block's first position + max(height,
width) in merged patches, leaving the block's temporal positions out. The two agree on images and
on videos whose last temporal position stays within their spatial extent; they differ on the
others. Qwen2.5-VL's temporal position of patch k is floor(k x tokens_per_second x seconds per
patch). A square clip at Video-R1's 128 x 28 x 28 pixels has 11 x 11 merged patches; 16 frames
sampled at 2 fps make 8 temporal patches, the last at position 14. transformers then resumes the
text 11 positions after the clip's start, Qwen's convention 15. So a vLLM rollout of such a clip
was scored by transformers' forward at other positions (measured on a tiny model: log-prob gaps
of 0.3 to 1, where they agree to 4e-6 otherwise). And a policy trained with transformers' positions
is served by vLLM with other ones.

`use_released_positions(model)` gives a policy's Qwen2-VL / Qwen2.5-VL model this convention. It
covers every training forward and Hugging Face `generate`, which both take their positions from
the model's `get_rope_index`. A checkpoint it trained loads anywhere unchanged: the positions are
computed, not stored.
"""

from __future__ import annotations

import itertools
import types

import torch
from torch import Tensor, nn

TEXT, IMAGE, VIDEO = 0, 1, 2  # mm_token_type_ids (the Qwen processors' convention)


def released_rope_index(core: nn.Module, input_ids: Tensor, mm_token_type_ids: Tensor,
                        image_grid_thw: Tensor | None = None, video_grid_thw: Tensor | None = None,
                        second_per_grid_ts: Tensor | None = None, attention_mask: Tensor | None = None,
                        **unused) -> tuple[Tensor, Tensor]:
    """`get_rope_index` of a Qwen2-VL / Qwen2.5-VL model (`core`, its `Qwen2VLModel` /
    `Qwen2_5_VLModel`) in the released convention: positions [3, B, S] (0 at padding) and each row's
    rope delta [B, 1] (its largest position + 1 - its length), as transformers returns them.

    A vision block of t x h x w merged patches starting at p gets temporal positions
    p + floor(k x step) (k < t; step: tokens_per_second x the video's seconds per temporal patch for
    Qwen2.5-VL videos, else 1), height p + i, width p + j; the next block starts at its largest + 1.
    transformers calls it only with `mm_token_type_ids` (text-only inputs take plain positions)."""
    vision = core.config.vision_config
    merge = vision.spatial_merge_size
    per_second = getattr(vision, "tokens_per_second", None)  # Qwen2.5-VL's time scale; Qwen2-VL has none
    grids = {IMAGE: iter(image_grid_thw if image_grid_thw is not None else ()),
             VIDEO: iter(video_grid_thw if video_grid_thw is not None else ())}
    seconds = iter(second_per_grid_ts) if second_per_grid_ts is not None else itertools.repeat(1.0)
    positions = torch.zeros(3, *input_ids.shape, dtype=input_ids.dtype, device=input_ids.device)
    deltas = []
    for row in range(input_ids.shape[0]):
        keep = attention_mask[row].bool() if attention_mask is not None else torch.ones_like(input_ids[row]).bool()
        blocks, start = [], 0
        for kind, run in itertools.groupby(mm_token_type_ids[row][keep].tolist()):
            length = len(list(run))
            if kind == TEXT:
                block = torch.arange(length).expand(3, length) + start
            else:
                t, h, w = (int(v) for v in next(grids[kind]))
                step = per_second * float(next(seconds)) if kind == VIDEO and per_second is not None else 1.0
                time = (torch.arange(t) * step).long()
                block = torch.stack(torch.meshgrid(time, torch.arange(h // merge), torch.arange(w // merge),
                                                   indexing="ij")).reshape(3, -1) + start
                if block.shape[1] != length:
                    raise ValueError(f"row {row}: a vision block of {length} tokens has a grid of "
                                     f"{t} x {h // merge} x {w // merge} merged patches")
            blocks.append(block)
            start = int(block.max()) + 1
        positions[:, row, keep] = torch.cat(blocks, 1).to(positions)
        deltas.append(start - int(keep.sum()))
    return positions, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)


def use_released_positions(model: nn.Module) -> int:
    """Bind `released_rope_index` as the `get_rope_index` of every Qwen2-VL / Qwen2.5-VL model inside
    `model` (a bound method: a deep copy of `model` binds it to the copy); how many were found."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
    cores = [m for m in model.modules() if isinstance(m, (Qwen2VLModel, Qwen2_5_VLModel))]
    for core in cores:
        core.get_rope_index = types.MethodType(released_rope_index, core)
    return len(cores)
