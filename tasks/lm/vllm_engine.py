"""vLLM as the rollout engine of a language-model policy (`policy.rollout_engine: vllm`): text
models, and vision-language models with images and videos (the engine is given the policy's
processor). Its settings (`policy.vllm`) and their checks are in `vllm_config.py`.

The engine is colocated: it lives in the training process (vLLM's in-process executor, so weights
are handed over as tensors, not copied through a pipe), is built on the first rollout from the
policy's model config with dummy weights, and receives the policy's current weights before any
rollout that follows a change of them (every optimizer step, a checkpoint load): the full weights
through the worker's in-place ``reload_weights``, or with LoRA the merged weights W + scale * B A
computed beside the training model (the trained module is never merged in place, so its weights
stay bit-exact). On a GPU with ``vllm.enable_sleep_mode``, the engine sleeps (level 2: KV cache
and weights freed) after each rollout, and wakes its weights, takes the new ones, then wakes its
KV cache for the next.

Under several processes (torchrun / accelerate launch) each process drives an engine of its own
on its own groups. Under a strategy that shards parameters (see docs/distributed.md) the weight
sync gathers the policy one shard unit at a time as the engine loads it
(`vllm_weights.export_weights`, `ParallelView.weights_in_turn`): every process takes part in each
gather, and the rollout itself needs no gathered training model.

Group g's completions depend on (prompt g, seed g) alone: every sample is its own request with a
seed derived from its group's seed and its index in the group, so rollouts do not depend on
which other groups share the batch or the process. Prefix caching shares a group's prompt.

Log-probs: ``logprobs_mode="processed_logprobs"`` with ``logprobs=0`` returns, per completion
token, the log-prob of the sampled token under the distribution vLLM sampled from, after the
temperature (and top-k / top-p when set). Without top-k / top-p that is the training forward's
log-softmax(logits / temperature), so `Rollout.rollout_logp` is directly comparable with it.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from mmrl.core.parallel import ParallelView

from .vllm_config import INSTALL_HINT, VLLMConfig, vllm_available
from .vllm_weights import export_weights, weights_fingerprint

def sample_seed(group_seed: int, index: int) -> int:
    """The seed of sample `index` of a group seeded `group_seed` (a function of the two alone)."""
    return (int(group_seed) * 1_000_003 + index) % (2 ** 63 - 1)


def launcher_backend() -> dict:
    """vLLM's executor settings under a multi-process launch (torchrun, accelerate):
    every process drives its own engine, inside itself, on its own prompts, as TRL's colocate mode
    does: vLLM's external_launcher backend, which takes the launcher's process group instead of
    starting its own (with tensor_parallel_size 1, each process is a tensor-parallel group of one;
    tested with 2 CPU processes). None under one process."""
    launched = torch.distributed.is_available() and torch.distributed.is_initialized() and \
        torch.distributed.get_world_size() > 1
    return {"distributed_executor_backend": "external_launcher"} if launched else {}


class VLLMEngine:
    """A colocated vLLM engine that samples completions of token-id prompts with the policy's weights."""

    def __init__(self, cfg: VLLMConfig, model: nn.Module, dtype: torch.dtype, device: torch.device,
                 tokenizer=None, processor=None, parallel: ParallelView | None = None):
        """`tokenizer` (saved beside the config) only where text is needed: stop strings are matched
        on vLLM's detokenized text; without one the engine runs on token ids alone. `processor` (a
        vision-language model's, saved beside the config) for prompts with images or videos: vLLM then runs
        it on each prompt's chat text and media, as the policy does. `parallel`: the policy's view of the
        run's distribution (`Policy.parallel`), through which a sharded model's weights are read."""
        if not vllm_available():
            raise ImportError(f"vllm is not importable; {INSTALL_HINT}")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: weights passed as tensors
        if device.type == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gib))
        from vllm import LLM
        self.cfg, self.parallel = cfg, parallel or ParallelView()
        self._dir = tempfile.TemporaryDirectory(prefix="mmrl-vllm-")
        self.sleep = cfg.enable_sleep_mode and device.type == "cuda"
        self.multimodal = processor is not None
        multimodal = self._write_model_dir(model, tokenizer, processor)
        self.llm = LLM(model=self._dir.name, skip_tokenizer_init=tokenizer is None and processor is None,
                       load_format="dummy", dtype=dtype, seed=0, enable_prefix_caching=True,
                       logprobs_mode="processed_logprobs", tensor_parallel_size=cfg.tensor_parallel_size,
                       max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
                       gpu_memory_utilization=cfg.gpu_memory_utilization, enable_sleep_mode=self.sleep,
                       enforce_eager=cfg.enforce_eager, **multimodal, **launcher_backend())
        self._synced: tuple | None = None
        self._watched: set[int] = set()  # ids of the policy's parameters, as its optimizer holds them
        self._stepped = False  # an optimizer stepped some of them since the last sync
        self._watch_optimizer_steps()
        if self.sleep:
            self.llm.sleep(level=2)

    def _write_model_dir(self, model: nn.Module, tokenizer, processor) -> dict:
        """Save what vLLM builds its model from into the engine's folder: the model config (the
        weights come from the policy: load_format=dummy) and the processor or tokenizer. Returns
        the engine's multimodal settings (none for a text model)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        hf_config = base.config
        if not hf_config.architectures:  # a model built from a config (tiny models) names no architecture
            hf_config.architectures = [self.parallel.plain_class(base).__name__]  # sharding subclasses it
        hf_config.save_pretrained(self._dir.name)
        if processor is None:
            if tokenizer is not None:
                tokenizer.save_pretrained(self._dir.name)
            return {}
        processor.save_pretrained(self._dir.name)
        # the processor normalises the pixels on the CPU, as for the training forward: vLLM's
        # default on-device normalisation keeps its constants in buffers that its in-place weight
        # reload does not restore (measured: garbage after the first sync, log-prob gaps of ~2
        # with vllm-cpu 0.32)
        return dict(limit_mm_per_prompt={"image": self.cfg.max_images_per_prompt,
                                         "video": self.cfg.max_videos_per_prompt},
                    mm_device_do_normalize=False)

    def _watch_optimizer_steps(self) -> None:
        """Mark the weights stale after any optimizer step on the parameters `stale` has seen:
        fused AdamW (the trainer's) updates parameters without bumping their version counters, so
        the fingerprint alone would miss optimizer steps."""
        engine = weakref.ref(self)

        def stepped(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
            this = engine()
            if this is not None and any(id(p) in this._watched for g in optimizer.param_groups for p in g["params"]):
                this._stepped = True
        hook = register_optimizer_step_post_hook(stepped)
        weakref.finalize(self, hook.remove)

    def stale(self, model: nn.Module) -> bool:
        """Whether `model`'s weights changed since the last sync (an optimizer step on them, an
        in-place write, new parameters). Where the model is sharded every process answers the same
        (all agree to gather, or none does)."""
        self._watched.update(id(p) for p in model.parameters())
        stale = self._stepped or weights_fingerprint(model, self.parallel) != self._synced
        return self.parallel.any_process(stale) if self.parallel.is_sharded(model) else stale

    def sync(self, model: nn.Module) -> bool:
        """Send `model`'s weights if they changed since the last sync; True if it sent them. A
        sharded model is gathered one shard unit at a time as the engine loads it
        (`export_weights`); every process must call this in step."""
        if not self.stale(model):
            return False
        if self.sleep:
            self.llm.wake_up(tags=["weights"])
        # sharded, to an engine in this process: a generator the engine consumes tensor by tensor,
        # each unit gathered and freed in turn; otherwise the tensors themselves (the engine copies them)
        lazy = self.parallel.is_sharded(model) and self.cfg.tensor_parallel_size == 1
        with torch.no_grad():
            weights = export_weights(model, self.parallel)
            weights = weights if lazy else list(weights)
            # reload_weights, not the model's load_weights: it undoes and redoes the backend's processing
            # of loaded weights (the CPU backend repacks linear weights, dropping their weight loaders)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        if self.multimodal:  # and cached image embeddings with the old vision tower
            self.llm.llm_engine.reset_encoder_cache()
        self._synced = weights_fingerprint(model, self.parallel)
        self._stepped = False
        return True

    def generate(self, model: nn.Module, prompts: Sequence[list[int] | dict], group_size: int, seeds: Sequence[int],
                 *, greedy: bool, temperature: float, top_k: int, top_p: float, max_new_tokens: int,
                 min_new_tokens: int, stop_token_ids: list[int], pad_token_id: int,
                 stop_strings: Sequence[str] = (), banned_token_ids: Sequence[int] = (),
                 expected_prompt_ids: Sequence[list[int]] | None = None,
                 ) -> tuple[Tensor, Tensor | None]:
        """Completion ids [N, T] (right-padded with `pad_token_id`) and their sampler log-probs
        [N, T] float32 (None for greedy), group by group, G rows per prompt. A prompt is its token
        ids, or a vLLM prompt dict (``{"prompt": chat text, "multi_modal_data": {"image": [...],
        "video": [(frames, metadata), ...]}, "mm_processor_kwargs": {...}}``), which vLLM's
        processor turns into token ids; `expected_prompt_ids` then asserts they are the
        policy's own. `stop_strings` end a completion at the token that completes one (kept, as
        transformers' `stop_strings` keeps it): vLLM checks them on the detokenized text after each
        token and stops there; its `token_ids` are not cut back, so they end with that token.
        `banned_token_ids` are never sampled (a bias of -100, vLLM's floor: their probability is
        at most e^-100 of another token's, so the others' log-probs are those of the banned softmax)."""
        requests = [prompt if isinstance(prompt, dict) else {"prompt_token_ids": list(prompt)}
                    for prompt in prompts for _ in range(group_size)]
        samples = self.complete(model, requests, [sample_seed(seed, i) for seed in seeds for i in range(group_size)],
                                greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p,
                                max_new_tokens=[max_new_tokens] * len(requests), min_new_tokens=min_new_tokens,
                                stop_token_ids=stop_token_ids, stop_strings=stop_strings,
                                banned_token_ids=banned_token_ids)
        if expected_prompt_ids is not None:
            check_prompt_ids(samples, [ids for ids in expected_prompt_ids for _ in range(group_size)])
        width = max(1, max(len(s.token_ids) for s in samples))
        ids = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
        logp = torch.zeros(len(samples), width, dtype=torch.float32)
        for row, sample in enumerate(samples):
            ids[row, :len(sample.token_ids)] = torch.tensor(sample.token_ids, dtype=torch.long)
            logp[row, :len(sample.logp)] = torch.tensor(sample.logp, dtype=torch.float32)
        return ids, (None if greedy else logp)

    def complete(self, model: nn.Module, requests: Sequence[dict], seeds: Sequence[int], *, greedy: bool,
                 temperature: float, top_k: int, top_p: float, max_new_tokens: Sequence[int], min_new_tokens: int,
                 stop_token_ids: list[int], stop_strings: Sequence[str] = (),
                 banned_token_ids: Sequence[int] = ()) -> list[Sample]:
        """One completion of each vLLM request (``{"prompt_token_ids": [...]}`` or a prompt dict, as
        `generate` takes them), sampled with its own seed and at most its own `max_new_tokens`,
        with the policy's current weights (synced first); the rest as `generate`."""
        from vllm import SamplingParams
        self.sync(model)
        if self.sleep:
            self._synced = None  # level-2 sleep drops the weights: re-send them after the next wake-up
            self.llm.wake_up(tags=["kv_cache"])
        bias = {int(t): -100.0 for t in banned_token_ids} or None
        params = [SamplingParams(
            n=1, seed=None if greedy else seed, temperature=0.0 if greedy else temperature,
            top_k=top_k if top_k > 0 else -1, top_p=top_p, max_tokens=most, min_tokens=min_new_tokens,
            stop_token_ids=stop_token_ids, logprobs=0, logit_bias=bias, stop=list(stop_strings) or None,
            include_stop_str_in_output=bool(stop_strings),
            detokenize=bool(stop_strings))  # stop strings are matched on the text
            for seed, most in zip(seeds, max_new_tokens)]
        outputs = self.llm.generate(list(requests), params, use_tqdm=False)
        if self.sleep:
            self.llm.sleep(level=2)
        samples = []
        for out in outputs:
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            logp = [0.0] * len(tokens) if greedy else [step[t].logprob for step, t in zip(sample.logprobs, tokens)]
            samples.append(Sample(list(out.prompt_token_ids), tokens, logp, sample.finish_reason == "stop"))
        return samples


@dataclass
class Sample:
    """One vLLM completion: the prompt's token ids as vLLM's processor made them, the sampled
    tokens, their sampler log-probs (0 for greedy), and whether it stopped (an eos or a stop
    string) rather than reaching its token limit."""

    prompt_ids: list[int]
    token_ids: list[int]
    logp: list[float]
    stopped: bool


def check_prompt_ids(samples: Sequence[Sample], expected: Sequence[list[int]]) -> None:
    """Raise where vLLM's processor made a prompt into other token ids than the policy's."""
    for row, (sample, ids) in enumerate(zip(samples, expected)):
        if sample.prompt_ids != list(ids):
            first = next((k for k, (a, b) in enumerate(zip(sample.prompt_ids, ids)) if a != b), None)
            raise RuntimeError(
                f"vLLM's processor made prompt row {row} into {len(sample.prompt_ids)} tokens, the policy's into "
                f"{len(ids)} (first difference at {first}): the rollout would not be the one trained on")
