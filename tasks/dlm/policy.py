"""Diffusion language models as policies (`task: dlm`): one unit per completion token. `DLMPolicy`
is the masked family's (below) and builds DiffusionGemma's (`policy.family: diffusion_gemma`,
`diffusion_gemma.py`) when the recipe names that family.

Masked family: any model that predicts masked tokens with bidirectional attention: LLaDA-8B-Instruct and Dream-7B
through `trust_remote_code` (``AutoModel``, as their model cards load them), or a `transformers`
decoder class made bidirectional (``config.is_causal = False`` and every attention module's
``is_causal = False``), like the demos' tiny model ``tiny:dlm-char``. Rollouts decode with
LLaDA's semi-autoregressive blocks (`generation.py`); log-probs (`scoring.py`) come from a
registered estimator (`estimators.py`) whose masks are drawn from seeds kept in the rollout, a
fresh draw for each update pass (`pass_view`).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import fields
from pathlib import Path
from typing import Any, Sequence

import torch
import transformers
from torch import Tensor, nn

from mmrl.core.rollout import Rollout
from mmrl.core.seeding import derive_seed
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS

from ..lm.chat_prompts import chat_template_check, prompt_text, tokenize_prompts
from ..lm.rollout_batches import concat_padded, eos_token_ids, first_eos_ends, units_before
from ..lm.token_logprobs import selective_log_softmax
from ..model_loading import DTYPES, load_tiny, load_tokenizer, pad_on_the_left
from ..lm.vlm import check_image
from .config import AUTO_CLASSES, DLMConfig, config_problems
from .diffusion_gemma import MASK_SEED_SALT, DiffusionGemmaPolicy
from .estimators import LOGP_ESTIMATORS
from .generation import DecodeConfig, block_decode
from .memory_formula import MaskedDLMMemory, masked_dlm_memory
from .outputs import TextRollouts
from .scoring import MaskedScoring

logger = logging.getLogger(__name__)


def make_bidirectional(model: nn.Module) -> nn.Module:
    """Full attention in a transformers decoder: `config.is_causal = False` makes the mask
    builders return a bidirectional (padding-only) mask, and clearing each attention module's
    `is_causal` stops SDPA / flash kernels from applying a causal mask when none is passed."""
    for config in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
        config.is_causal = False
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False
    return model


@ADAPTERS.register("dlm")
class DLMPolicy(TextRollouts, MaskedScoring):
    Config = DLMConfig
    runs_in_rollout_worker = True

    def __new__(cls, cfg: DLMConfig):
        """The family's policy: this class for masked models, `DiffusionGemmaPolicy` for DiffusionGemma."""
        if cfg.family == "diffusion_gemma":
            return DiffusionGemmaPolicy(cfg)
        return super().__new__(cls)

    @classmethod
    def config_problems(cls, cfg: DLMConfig) -> list[str]:
        return config_problems(cfg)

    @classmethod
    def unit_terms(cls, cfg: DLMConfig) -> str:
        """SPG's estimator gives a lower and an upper bound per unit (algorithm.objective: spg)."""
        return "logprob_bounds" if cfg.estimator == "spg" and cfg.family == "masked" else "logprobs"

    @classmethod
    def media_columns(cls, cfg: DLMConfig) -> dict[str, Any]:
        return {cfg.image_column: check_image} if cfg.family == "diffusion_gemma" else {}

    @classmethod
    def rollout_worker_problem(cls, policy: dict) -> str | None:
        if policy.get("family") == "diffusion_gemma":
            return "policy.family=diffusion_gemma (its rollouts run in the trainer's process)"
        if policy.get("temperature", DecodeConfig.temperature) == 0:
            return "policy.temperature=0 (greedy decoding records no behaviour log-probs to correct stale rows with)"
        return None

    def __init__(self, cfg: DLMConfig):
        if not cfg.model:
            raise ValueError("policy.model must name a model (hub id, local path, or tiny:NAME)")
        if cfg.dtype not in DTYPES:
            raise ValueError(f"policy.dtype={cfg.dtype!r} is not one of {sorted(DTYPES)}")
        if cfg.auto_class not in AUTO_CLASSES:
            raise ValueError(f"policy.auto_class={cfg.auto_class!r} is not one of {AUTO_CLASSES}")
        if problems := config_problems(cfg):
            raise ValueError(problems[0])
        self.estimate = LOGP_ESTIMATORS.get(cfg.estimator)
        self.decode = DecodeConfig(**{f.name: getattr(cfg, f.name) for f in fields(DecodeConfig)})
        self.decode.check()
        self.cfg = cfg
        self._load(cfg)
        self.mask_id = cfg.mask_token_id if cfg.mask_token_id is not None else self.tokenizer.mask_token_id
        if self.mask_id is None:
            raise ValueError(f"policy.mask_token_id: the tokenizer of {cfg.model!r} has no mask token; set it")
        pad_on_the_left(self.tokenizer)
        self.eos_ids = eos_token_ids(self.model, self.tokenizer)
        if cfg.device:
            self.model.to(cfg.device)
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        accepted = inspect.signature(self.model.forward).parameters
        self._accepts = {name for name in ("attention_mask", "position_ids", "logits_to_keep", "use_cache")
                         if name in accepted}
        self.sft_generator = torch.Generator().manual_seed(cfg.sft_seed)

    @classmethod
    def memory_model(cls, cfg: DLMConfig, prompt_length: int) -> MaskedDLMMemory:
        if cfg.family != "masked":
            raise UserError(f"mmrl plan: the adapter {cls.__name__} has no memory formula yet for policy.family="
                            f"{cfg.family!r} (block diffusion with its cache); its memory is not planned")
        return masked_dlm_memory(cfg, prompt_length)

    @classmethod
    def prompt_check(cls, cfg: DLMConfig):
        """Message-list prompts (or any, with chat_template true) need the tokenizer's chat template
        (DiffusionGemma's prompts with images: the processor's)."""
        return None if cfg.family == "diffusion_gemma" else chat_template_check(cfg)

    def _load(self, cfg: DLMConfig) -> None:
        if cfg.model.startswith("tiny:"):
            self.model, self.tokenizer = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)
            return
        self.tokenizer = load_tokenizer(cfg)
        auto = getattr(transformers, cfg.auto_class)
        self.model = make_bidirectional(auto.from_pretrained(cfg.model, dtype=DTYPES[cfg.dtype],
                                                             trust_remote_code=cfg.trust_remote_code))

    @property
    def max_units(self) -> int:
        return self.cfg.gen_length

    # ----- prompts ------------------------------------------------------------------------
    def prompt_text(self, prompt: Any) -> str:
        """A string prompt as is; a list of chat messages through the chat template."""
        return prompt_text(self.tokenizer, prompt, self.cfg.chat_template, self.cfg.system_prompt)

    def _encode(self, rows: Sequence[Any]) -> tuple[Tensor, Tensor]:
        return tokenize_prompts(self.tokenizer, [self.prompt_text(self.prompt_of(r)) for r in rows])

    # ----- rollout ------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int],
                greedy: bool = False) -> Rollout:
        prompt_ids, prompt_mask = self._encode(prompts)
        prompt_ids = prompt_ids.repeat_interleave(group_size, 0)
        prompt_mask = prompt_mask.repeat_interleave(group_size, 0)
        was_training = self.model.training
        self.model.eval()
        sampled = not greedy and self.decode.temperature > 0
        trace = block_decode(
            lambda x, a, p: self.logits(self.model, x, a, p), prompt_ids.to(self.device),
            prompt_mask.to(self.device), self.decode, self.mask_id, self.eos_ids[0],
            None if greedy else seeds, group_size, traced=True)
        completion_ids = trace.ids.cpu()
        self.model.train(was_training)
        unit_mask, truncated = self._completion_mask(completion_ids)
        ends = unit_mask.sum(1).long().tolist()
        texts = [self.tokenizer.decode(ids[:n], skip_special_tokens=True) for ids, n in zip(completion_ids, ends)]
        mask_seeds = torch.tensor([derive_seed(int(s), MASK_SEED_SALT, j) for s in seeds for j in range(group_size)])
        return Rollout(
            group_id=torch.arange(len(prompts)).repeat_interleave(group_size),
            prompts=[self.prompt_of(p) for p in prompts for _ in range(group_size)],
            completions=texts, unit_mask=unit_mask, truncated=truncated,
            columns={"completion_ids": [ids[:n].tolist() for ids, n in zip(completion_ids, ends)]},
            extras={"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                    "completion_step": trace.step.cpu(), "completion_entropy": trace.entropy.cpu(),
                    "mask_seed": mask_seeds, "mask_pass": 0},
            rollout_logp=trace.logp.cpu() * unit_mask if sampled else None)  # greedy decoding has no draw

    def _completion_mask(self, completion_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Units up to and including the first EOS (the canvas after it is EOS filler);
        truncated = no EOS in the canvas."""
        return units_before(first_eos_ends(completion_ids, self.eos_ids), completion_ids.shape[1])

    def concat(self, parts: Sequence[Rollout]) -> Rollout:
        """Left-pad prompts to a common width (completions all have `gen_length` tokens)."""
        return concat_padded(parts, self.tokenizer.pad_token_id)

    def supervised_loss(self, model: nn.Module, rows: Sequence[dict], target_column: str) -> Tensor:
        """LLaDA's masked-diffusion SFT loss: the target (+ EOS filler up to `gen_length`) masked
        at time t per row, loss = mean_rows (1 / (t L)) sum_{masked} -log p(y_u | x_t)
        (Nie et al. 2025, eq. 5), the prompt never masked. The rows' times are stratified,
        t_i = eps + (1 - eps) (i + u) / B with one u ~ U(0, 1) (MDLM's low-discrepancy sampler,
        Sahoo et al. 2024): still uniform per row, with far less variance from the 1/t weight."""
        prompt_ids, prompt_mask = self._encode(rows)
        width, eos = self.cfg.gen_length, self.eos_ids[0]
        targets = torch.full((len(rows), width), eos, dtype=torch.long)
        for i, r in enumerate(rows):
            ids = self.tokenizer(str(r[target_column]), add_special_tokens=False)["input_ids"]
            if len(ids) >= width:
                raise ValueError(f"warm start: {target_column}={r[target_column]!r} has {len(ids)} tokens; "
                                 f"policy.gen_length={width} leaves no room for EOS")
            targets[i, :len(ids)] = torch.tensor(ids)
        eps = 1e-3
        t = eps + (1 - eps) * (torch.arange(len(rows)) + torch.rand((), generator=self.sft_generator)) / len(rows)
        masked = torch.rand(len(rows), width, generator=self.sft_generator) < t[:, None]
        ids = torch.cat([prompt_ids, targets.masked_fill(masked, self.mask_id)], dim=1)
        attention = torch.cat([prompt_mask, torch.ones(len(rows), width, dtype=prompt_mask.dtype)], dim=1)
        plen = prompt_ids.shape[1]
        logp, _ = selective_log_softmax(self.logits(model, ids, attention, torch.arange(plen, plen + width)),
                                        targets.to(self.device))
        weight = (masked.float() / (t[:, None] * width)).to(logp.device)
        return -(logp * weight).sum() / len(rows)

    def save_pretrained(self, model: nn.Module, path: Path,  # as CausalLMPolicy's (not a subclass)
                        state_dict: dict[str, Tensor] | None = None) -> None:
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
