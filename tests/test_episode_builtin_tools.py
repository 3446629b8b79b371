"""The built-in tools (tasks/lm/image_tools.py, tasks/lm/python_tool.py): crop / zoom in the
image's and the model's frames, select_frames, and the sandboxed Python calculator."""

import numpy as np
import pytest
from PIL import Image
from mmrl.tasks.lm.python_tool import run_python
from mmrl.tasks.lm.tools import EpisodeView, ToolCall, resolve_tools, run_tool

from mmrl.sandbox import Limits

NOISE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (100, 200, 3), dtype=np.uint8))  # 200 x 100
TOOLS = resolve_tools(["zoom", "crop", "select_frames", "python"], [])


def called(name: str, view: EpisodeView, **arguments) -> ToolCall:
    return run_tool(ToolCall(name, arguments), TOOLS, view)


@pytest.mark.parametrize("frame, box", [("image", [20, 10, 60, 50]),
                                        ("input", [10, 5, 30, 25]),  # the processor resized 200x100 to 100x50
                                        ("normalized_1000", [100, 100, 300, 500])])
@pytest.mark.parametrize("tool", ["zoom", "crop"])
def test_the_crop_is_the_hand_crop_of_the_original_image_in_every_frame(tool, frame, box):
    view = EpisodeView(images=[NOISE], input_sizes=[[100, 50]], box_frame=frame)
    call = called(tool, view, bbox_2d=box)
    assert call.error is None and len(call.images) == 1
    hand = np.asarray(NOISE)[10:50, 20:60]  # rows y1:y2, columns x1:x2 of the original pixels
    assert np.array_equal(np.asarray(call.images[0]), hand)


@pytest.mark.parametrize("arguments, message", [
    ({"bbox_2d": [150, 10, 260, 50]}, "outside the image"),
    ({"bbox_2d": [-30, -30, -10, -10]}, "outside the image"),
    ({"bbox_2d": [20, 10, 20, 50]}, "less than"),
    ({"bbox_2d": [60, 50, 20, 10]}, "less than"),
    ({"bbox_2d": [1, 2, 3]}, "four numbers"),
    ({"bbox_2d": ["a", 2, 3, 4]}, "four numbers"),
    ({"bbox_2d": [20, 10, 60, 50], "image_index": 1}, "has 1 image"),
    ({"box": [20, 10, 60, 50]}, "TypeError"),
])
def test_a_bad_box_is_a_tool_error_not_a_crash(arguments, message):
    call = called("zoom", EpisodeView(images=[NOISE], input_sizes=[None]), **arguments)
    assert call.error is not None and message in call.error and call.images == []


def test_the_model_frame_needs_the_processor_size():
    call = called("crop", EpisodeView(images=[NOISE], input_sizes=[None], box_frame="input"), bbox_2d=[1, 1, 9, 9])
    assert "input frame" in call.error


def test_select_frames_by_index_and_by_time():
    from transformers.video_utils import VideoMetadata
    frames = np.stack([np.full((8, 8, 3), 10 * i, dtype=np.uint8) for i in range(4)])  # sampled frames 0, 10, 20, 30
    meta = VideoMetadata(total_num_frames=40, fps=10.0, frames_indices=[0, 10, 20, 30])
    view = EpisodeView(videos=[frames], video_metadata=[meta])
    by_index = called("select_frames", view, indices=[3, 1])
    assert [int(np.asarray(im)[0, 0, 0]) for im in by_index.images] == [30, 10]
    by_time = called("select_frames", view, times=[2.1, 0.4])  # nearest sampled frames: 2.0 s and 0.0 s
    assert [int(np.asarray(im)[0, 0, 0]) for im in by_time.images] == [20, 0]
    assert "0 to 3" in called("select_frames", view, indices=[4]).error
    assert "one of them" in called("select_frames", view).error


FAST = Limits(timeout=2.0, memory_mb=256, file_mb=0, open_files=16)


def test_the_calculator_computes():
    assert run_python("import math\nprint(math.comb(10, 3))\n2 ** 0.5 * 2 ** 0.5", FAST) == "120\n2.0000000000000004\n"
    assert called("python", EpisodeView(), code="sum(range(101))").result == "5050\n"


@pytest.mark.parametrize("code, message", [
    ("open('/etc/passwd').read()", "name 'open' is not defined"),
    ("import os", "may import only"),
    ("import subprocess", "may import only"),
    ("import socket", "may import only"),
    ("__import__('os')", "may import only"),
    # a way past the builtins to os.system is stopped by the audit hook
    ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
     ".__init__.__globals__['system']('echo escaped')", "may not use os.system"),
    ("while True: pass", "time limit"),
    ("x = bytearray(10 ** 9)", "memory limit"),
])
def test_the_calculator_refuses_files_imports_and_runaways(code, message):
    with pytest.raises(RuntimeError, match=message):
        run_python(code, FAST)


def test_a_refused_calculation_is_a_tool_error():
    call = called("python", EpisodeView(), code="import os")
    assert "may import only" in call.error and call.result == ""


def test_a_tool_reads_each_image_in_the_frame_the_processor_resized_it_to():
    """The episode's `input_sizes` are the vlm adapter's `input_size` column (the IoU reward's frame)."""
    from mmrl.tasks.lm.episodes import EpisodeConfig, EpisodeRunner
    from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", tiny_args={"hidden": 64, "layers": 2, "heads": 2},
                                 max_new_tokens=4, episode=EpisodeConfig(tools=["zoom"], box_frame="input")))
    rows = [{"prompt": "x", "image": Image.fromarray(np.zeros((90, 130, 3), dtype=np.uint8))}]
    parts = policy._prompt_parts(rows)
    view = EpisodeRunner(policy)._start(parts[0], policy._encode_parts(parts), 0, rows[0]).view
    assert view.input_sizes == policy.rollout(rows, 1, seeds=[1]).columns["input_size"] != [[130, 90]]
    assert view.box_frame == "input" and view.images[0].size == (130, 90)


def test_an_unknown_box_frame_is_refused_when_the_recipe_is_read():
    from mmrl.tasks.lm.episodes import EpisodeConfig, episode_config_problems
    assert episode_config_problems(EpisodeConfig(tools=["zoom"], box_frame="pixels")) == [
        "policy.episode.box_frame='pixels' is not one of image, input, normalized_1000"]
