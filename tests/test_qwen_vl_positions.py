"""Qwen2-VL / Qwen2.5-VL rotary positions in the released models' convention (tasks/lm/qwen_vl_positions.py):
a hand-written reference, where it departs from transformers 5's, and that the policy uses it."""

import copy

import pytest
import torch
from mmrl.tasks.lm.qwen_vl_positions import released_rope_index, use_released_positions
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy
from mmrl.tasks.model_loading import load_tiny


@pytest.fixture(scope="module")
def core():
    model, _ = load_tiny("tiny:qwen2.5-vl-char", {}, "float32")
    return model.model


def test_text_resumes_after_the_largest_position_of_a_video(core):
    """Two text tokens, a video of 4 temporal x 4 x 4 patches (2 x 2 merged), one second per
    temporal patch, then three text tokens; written out by hand from the convention: temporal
    positions 2 + floor(k x tokens_per_second), height and width 2 + i, 2 + j, and the text
    resuming at the video's largest position + 1."""
    per_second = core.config.vision_config.tokens_per_second
    types = [0, 0] + [2] * 16 + [0, 0, 0]
    ids = torch.zeros(1, len(types), dtype=torch.long)
    positions, delta = released_rope_index(core, ids, torch.tensor([types]), video_grid_thw=torch.tensor([[4, 4, 4]]),
                                           second_per_grid_ts=torch.tensor([1.0]))
    time = [2 + k * per_second for k in range(4) for _ in range(4)]
    height = [2 + i for _ in range(4) for i in (0, 0, 1, 1)]
    width = [2 + j for _ in range(4) for j in (0, 1, 0, 1)]
    resume = max(time[-1], 3) + 1
    text_after = [resume, resume + 1, resume + 2]
    assert positions[:, 0].tolist() == [[0, 1] + time + text_after, [0, 1] + height + text_after,
                                        [0, 1] + width + text_after]
    assert delta.tolist() == [[resume + 3 - len(types)]]
    # transformers 5 resumes at 2 + max(2, 2) = 4 instead, below the video's last temporal position
    theirs, _ = type(core).get_rope_index(core, ids, mm_token_type_ids=torch.tensor([types]),
                                          video_grid_thw=torch.tensor([[4, 4, 4]]),
                                          second_per_grid_ts=torch.tensor([1.0]))
    assert per_second * 3 > 2 and theirs[0, 0, -3].item() == 4 != resume


def test_padding_images_and_short_videos_agree_with_transformers(core):
    """Left padding keeps position 0; an image, and a video whose temporal positions stay within its
    spatial extent, get transformers' positions."""
    types = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 0, 0, 2, 2, 2, 2, 0],
                          [-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0]]).clamp(min=0)
    mask = torch.ones_like(types)
    mask[1, :10] = 0
    ids = torch.zeros_like(types)
    grids = {"image_grid_thw": torch.tensor([[1, 4, 4]]), "video_grid_thw": torch.tensor([[1, 4, 4]]),
             "second_per_grid_ts": torch.tensor([0.1])}
    ours, ours_delta = released_rope_index(core, ids, types, attention_mask=mask, **grids)
    theirs, their_delta = type(core).get_rope_index(core, ids, mm_token_type_ids=types, attention_mask=mask, **grids)
    assert torch.equal(ours, theirs) and torch.equal(ours_delta.cpu(), their_delta.cpu())
    assert ours[:, 1, :10].eq(0).all() and ours[0, 1, 10:].tolist() == [0, 1, 2, 3]


def test_the_policy_model_and_its_copies_use_the_released_positions():
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char"))
    core = policy.model.model
    assert core.get_rope_index.__func__ is released_rope_index and core.get_rope_index.__self__ is core
    clone = copy.deepcopy(policy.model)  # a reference model is a copy: bound to its own core
    assert clone.model.get_rope_index.__self__ is clone.model
    assert use_released_positions(torch.nn.Linear(2, 2)) == 0
