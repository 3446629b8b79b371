"""Autoregressive language models as policies: one unit per completion token.

Any ``AutoModelForCausalLM`` with its tokenizer (and chat template for message-list prompts).
This module loads the model and encodes prompts; the rollouts (HF ``generate`` or vLLM, shared
prefill) are `generation.py`'s `TokenRollouts`, the completion tokens' log-probs `scoring.py`'s
`TokenScoring`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from mmrl.registry import ADAPTERS

from ..model_loading import (
    DTYPES,
    load_tiny,
    load_tokenizer,
    model_configuration,
    pad_on_the_left,
    pretrained,
    weightless,
)
from .episodes import EPISODE_COLUMNS, EpisodeConfig, EpisodeRunner, episode_config_problems
from .chat_prompts import chat_template_check, cut_prompts_left, prompt_text, tokenize_prompts
from .generation import TokenRollouts
from .memory_formula import DecoderMemory, decoder_memory
from .logprob_settings import (
    logprob_check_field,
    logprob_check_tolerance_field,
    logprob_chunk_tokens_field,
    logprob_setting_problems,
    logprobs_from_field,
)
from .prefix_sharing import SHARED_ATTENTION, unsupported_reason
from .scoring import TokenScoring
from .vllm_config import VLLMConfig
from .vllm_config import config_problems as vllm_config_problems
from .vllm_engine import VLLMEngine


@dataclass
class CausalLMConfig:
    model: str = field(default="", metadata={"help": (
        "Hub id or local path of the model, or tiny:NAME for a tiny random model built from a config (tests, "
        "demos).")})
    tokenizer: str | None = field(default=None, metadata={"help": (
        "Hub id or path of the tokenizer; null: the model's.")})
    tiny_args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments of the tiny model builder when model is tiny:NAME (hidden, layers, seed, ...).")})
    dtype: str = field(default="float32", metadata={"help": (
        "Weights' dtype: float32, bfloat16 or float16 (log-probs are always computed in fp32)."),
        "choices": "mmrl.tasks.model_loading:DTYPES"})
    device: str | None = field(default=None, metadata={"help": (
        "Move the model to this device (e.g. cuda:0); null: leave placement to accelerate.")})
    attn_implementation: str | None = field(default=None, metadata={"help": (
        "transformers' attention implementation (sdpa, eager, flash_attention_2); null: transformers' default. "
        "Prefix sharing needs sdpa or eager.")})
    trust_remote_code: bool = field(default=False, metadata={"help": (
        "Allow the model's own code from the hub (transformers' trust_remote_code).")})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of rollouts."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold of rollouts (1: off)."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling of rollouts (0: off)."})
    max_new_tokens: int = field(default=128, metadata={"help": (
        "The most tokens a completion may have; longer ones are truncated (and Dr. GRPO's constant normaliser).")})
    max_prompt_length: int | None = field(default=None, metadata={"help": (
        "The most tokens a prompt may have (after the chat template). causal_lm cuts a longer prompt from the left "
        "to its last max_prompt_length tokens, as TRL's max_prompt_length does; vlm and audio_lm refuse it. "
        "null: prompts are not cut, and one that leaves fewer than max_new_tokens of the model's positions "
        "(max_position_embeddings) stops the run with an error naming it.")})
    min_new_tokens: int = field(default=0, metadata={"help": (
        "The fewest tokens a completion must have (EOS suppressed before).")})
    stop_strings: list[str] = field(default_factory=list, metadata={"help": (
        "Strings that end a completion (it keeps the stop string); both rollout engines (hf, vllm) stop "
        "sampling there.")})
    chat_template: bool | None = field(default=None, metadata={"help": (
        "Apply the tokenizer's chat template: true (a string prompt becomes the user's message), false (prompts "
        "must be strings), null (only for prompts given as message lists).")})
    system_prompt: str | None = field(default=None, metadata={"help": (
        "A system message put first when the chat template is applied.")})
    mask_truncated: bool = field(default=False, metadata={"help": (
        "Truncated completions (no EOS within max_new_tokens) take no part in the loss (DAPO's overlong "
        "filtering).")})
    gradient_checkpointing: bool = field(default=False, metadata={"help": (
        "Recompute activations in backward to save memory.")})
    logprobs_from: Literal["hidden_states", "logits"] = logprobs_from_field()
    logprob_chunk_tokens: int = logprob_chunk_tokens_field()
    logprob_chunk_rows: int = field(default=1024, metadata={"help": (
        "Logit rows per chunk of the fp32 log-softmax over the vocabulary with logprobs_from logits, so the full "
        "fp32 logits of a micro-batch are never held at once (memory bound, not a numeric setting).")})
    logprob_check: bool = logprob_check_field()
    logprob_check_tolerance: float | None = logprob_check_tolerance_field()
    # log-prob passes run each group's prompt once (prefix_sharing.py); YAML's on/off are
    # booleans, so true / false mean on / off
    prefix_sharing: Literal["auto", "on", "off"] | bool = field(default="auto", metadata={"help": (
        "Log-prob passes run each group's prompt once, as [prompt; completion_1; ...] under a 4D mask (Prefix "
        "Grouper): on, off, or auto (when it at least halves the tokens). Same log-probs and gradients.")})
    shared_prefill: bool = field(default=True, metadata={"help": (
        "Rollouts prefill each prompt once and repeat its KV cache for the group's G samples (same samples as G "
        "prefills).")})
    rollout_engine: Literal["hf", "vllm"] = field(default="hf", metadata={"help": (
        "What samples rollouts: hf (transformers generate) or vllm (a colocated vLLM engine, sent the weights "
        "after every optimizer step; see policy.vllm and docs/vllm.md). Rollout servers instead: hf_server or vllm_server "
        "(docs/distributed.md#served-rollouts).")})
    vllm: VLLMConfig = field(default_factory=VLLMConfig, metadata={"help": (
        "The vLLM engine's settings when rollout_engine is vllm.")})
    episode: EpisodeConfig = field(default_factory=EpisodeConfig, metadata={"help": (
        "Multi-turn, tool-using rollouts (episodes): the tools and the turn, token and image budgets "
        "(docs/episodes.md). Off while episode.tools is empty.")})


@ADAPTERS.register("causal_lm")
class CausalLMPolicy(TokenRollouts, TokenScoring):
    runs_in_rollout_worker = True
    Config = CausalLMConfig
    # read at each rollout / log-prob pass, so a training stage may change them
    stage_fields = frozenset({"max_new_tokens", "min_new_tokens", "top_p", "top_k", "stop_strings",
                              "mask_truncated"})
    rollout_engines = ("hf", "vllm")  # what `policy.rollout_engine` may name for this adapter

    @classmethod
    def config_problems(cls, cfg: CausalLMConfig) -> list[str]:
        problems = []
        if not cfg.model:
            problems.append("policy.model must name a model (hub id, local path, or tiny:NAME)")
        if cfg.dtype not in DTYPES:
            problems.append(f"policy.dtype={cfg.dtype!r} is not one of {sorted(DTYPES)}")
        if cfg.max_prompt_length is not None and cfg.max_prompt_length < 1:
            problems.append(f"policy.max_prompt_length={cfg.max_prompt_length} must be at least 1 (null: no limit)")
        if cfg.temperature <= 0:
            problems.append(f"policy.temperature={cfg.temperature} must be > 0")
        problems.extend(logprob_setting_problems(cfg))
        if cfg.logprob_chunk_rows < 1:
            problems.append(f"policy.logprob_chunk_rows={cfg.logprob_chunk_rows} must be at least 1")
        if cfg.prefix_sharing not in ("auto", "on", "off", True, False):
            problems.append(f"policy.prefix_sharing={cfg.prefix_sharing!r} is not one of auto, on, off")
        elif cfg.prefix_sharing in ("on", True) and cfg.attn_implementation not in (None, *SHARED_ATTENTION):
            problems.append(f"policy.prefix_sharing=on needs a dense 4D attention mask, which "
                            f"policy.attn_implementation={cfg.attn_implementation!r} does not take (supported: "
                            f"{', '.join(SHARED_ATTENTION)}); set prefix_sharing to auto or off, or another attention")
        if cfg.rollout_engine not in cls.rollout_engines:
            problems.append(f"policy.rollout_engine={cfg.rollout_engine!r}: the {cls.__name__} adapter supports "
                            f"{', '.join(cls.rollout_engines)}")
        elif cfg.rollout_engine == "vllm":
            problems.extend(vllm_config_problems(cfg.vllm))
        if cfg.episode.tools:
            problems.extend(episode_problems(cfg))
        return problems

    @classmethod
    def model_configuration(cls, cfg: CausalLMConfig) -> Any:
        """The transformers configuration: the tiny builder's, or the path's or hub id's config.json."""
        if cfg.model.startswith("tiny:"):
            with weightless():
                return load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)[0].config
        return model_configuration(cfg.model, cfg.trust_remote_code)

    @classmethod
    def memory_model(cls, cfg: CausalLMConfig, prompt_length: int) -> DecoderMemory:
        return decoder_memory(cfg, prompt_length)

    @classmethod
    def output_kind(cls, cfg: CausalLMConfig) -> str:
        return "episode" if cfg.episode.tools else "text"

    @classmethod
    def rollout_columns(cls, cfg: CausalLMConfig) -> tuple[str, ...]:
        return EPISODE_COLUMNS if cfg.episode.tools else ("completion_ids",)

    @classmethod
    def prompt_check(cls, cfg: CausalLMConfig):
        """Message-list prompts (or any, with chat_template true) need the tokenizer's chat template."""
        return chat_template_check(cfg)

    def __init__(self, cfg: CausalLMConfig):
        problems = self.config_problems(cfg)
        if problems:
            raise ValueError(problems[0])
        if isinstance(cfg.prefix_sharing, bool):
            cfg.prefix_sharing = "on" if cfg.prefix_sharing else "off"
        self.cfg = cfg
        self._vllm: VLLMEngine | None = None  # built on the first rollout with rollout_engine vllm
        self._episodes = EpisodeRunner(self) if cfg.episode.tools else None
        self._load(cfg)
        pad_on_the_left(self.tokenizer)
        if cfg.prefix_sharing == "on" and (reason := unsupported_reason(self.model.config)) is not None:
            raise ValueError(f"policy.prefix_sharing=on: {reason}; set policy.prefix_sharing to auto or off")
        if cfg.device:
            self.model.to(cfg.device)
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            self.model.config.use_cache = False

    @property
    def rollout_runs_model(self) -> bool:
        return self.cfg.rollout_engine == "hf"  # vllm: the engine holds its own copy of the weights

    def _load(self, cfg: CausalLMConfig) -> None:
        """Set `model` and `tokenizer`: a registered tiny model, or `from_pretrained`."""
        if cfg.model.startswith("tiny:"):
            self.model, self.tokenizer = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype, cfg.attn_implementation)
            return
        self.tokenizer = load_tokenizer(cfg)
        self.model = pretrained(AutoModelForCausalLM, cfg.model, dtype=DTYPES[cfg.dtype],
                                attn_implementation=cfg.attn_implementation, trust_remote_code=cfg.trust_remote_code)

    @property
    def max_units(self) -> int:
        return self.cfg.episode.max_tokens if self._episodes else self.cfg.max_new_tokens

    def suppressed_tokens(self) -> list[int]:
        """Token ids never sampled (a text model: none)."""
        return []

    # ----- prompts -------------------------------------------------------------------------
    def prompt_text(self, prompt: Any) -> str:
        """A string prompt as is; a list of chat messages through the chat template."""
        return prompt_text(self.tokenizer, prompt, self.cfg.chat_template, self.cfg.system_prompt,
                           self._episodes.schemas if self._episodes else None)

    def _encode_prompts(self, prompts: Sequence[Any]) -> dict[str, Any]:
        """Per-prompt model inputs: left-padded `prompt_ids` / `prompt_mask` (keys starting with
        `prompt_` are [P, L] tensors padded on the left), plus adapter-specific entries."""
        return self._encode_parts(self._prompt_parts(prompts))

    def _prompt_parts(self, prompts: Sequence[Any]) -> list:
        """What encoding a prompt and sending it to vLLM both start from, prepared once per rollout:
        its text (an adapter with media: its chat text and decoded media)."""
        return [self.prompt_text(self.prompt_of(p)) for p in prompts]

    def _encode_parts(self, parts: list) -> dict[str, Any]:
        """`_encode_prompts` from the prompts' `_prompt_parts`."""
        ids, mask = tokenize_prompts(self.tokenizer, parts)
        if self.cfg.max_prompt_length is not None:
            ids, mask = cut_prompts_left(ids, mask, self.cfg.max_prompt_length)
        return {"prompt_ids": ids, "prompt_mask": mask}

    def _model_inputs(self, rows: dict[str, Any], completion_ids: Tensor | None = None,
                      completion_mask: Tensor | None = None) -> dict[str, Tensor]:
        """Keyword inputs of `generate` (prompt only) or of the forward (prompt + completion)."""
        device = self.device
        input_ids, attention = rows["prompt_ids"], rows["prompt_mask"]
        if completion_ids is None:
            return {"input_ids": input_ids.to(device), "attention_mask": attention.to(device)}
        input_ids = torch.cat([input_ids, completion_ids], dim=1).to(device)
        if "completion_context_mask" in rows:  # an episode: its tool turns are context too
            completion_mask = rows["completion_context_mask"][:, :completion_ids.shape[1]]
        attention = torch.cat([attention, completion_mask.to(attention.dtype)], dim=1).to(device)
        return {"input_ids": input_ids, "attention_mask": attention,
                "position_ids": (attention.cumsum(-1) - 1).clamp(min=0)}

    def supervised_loss(self, model: nn.Module, rows: Sequence[dict], target_column: str) -> Tensor:
        """Mean token NLL of `target_column` (+ eos) after the prompt, at temperature 1, over the
        whole vocabulary (standard supervised fine-tuning; no sampler bans)."""
        prompts = self._encode_prompts(rows)
        targets = [self.tokenizer(str(r[target_column]), add_special_tokens=False)["input_ids"]
                   + [self.tokenizer.eos_token_id] for r in rows]
        width = max(len(t) for t in targets)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width)
        for i, t in enumerate(targets):
            ids[i, :len(t)] = torch.tensor(t)
            mask[i, :len(t)] = 1
        logp, _ = self._token_logprobs(model, prompts, ids, mask, 1.0, False, as_sampled=False,
                                       head=self._output_head(model))
        mask = mask.to(logp.device)
        return -(logp * mask).sum() / mask.sum()

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
        self.tokenizer.save_pretrained(path)


def episode_problems(cfg: CausalLMConfig) -> list[str]:
    """What an episode recipe (policy.episode.tools set) cannot run with, tools resolved before any model loads."""
    problems = episode_config_problems(cfg.episode)
    if cfg.prefix_sharing in ("on", True):
        problems.append("policy.prefix_sharing=on: an episode's tool turns break the one-prompt layout; set auto or off")
    try:
        from .tools import resolve_tools
        resolve_tools(cfg.episode.tools, cfg.episode.tool_modules)
    except (KeyError, ValueError, FileNotFoundError, ImportError) as e:
        problems.append(str(e).strip('"'))
    return problems
