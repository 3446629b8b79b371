"""DiffusionGemma as a `dlm` policy (`policy.family: diffusion_gemma`): one unit per completion
token of `DiffusionGemmaForBlockDiffusion` (transformers), images in the prompt read by its vision
tower.

Rollouts run the block diffusion sampler (`block_diffusion_sampler.py`, `generate`'s loop with each
group's noise from its seed) over `gen_length / canvas_length` canvases; log-probs come from
`block_diffusion_scoring.py` (`policy.estimator`: final_step or diffu_grpo). Prompts go through the
model's processor one at a time (text and images; `tasks/lm/multimodal.py`'s encoding), so a row's
inputs never depend on the other rows. Saved weights (or a LoRA adapter) load with
`DiffusionGemmaForBlockDiffusion.from_pretrained` (plus PEFT's `PeftModel.from_pretrained`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout
from mmrl.core.seeding import derive_seed

from ..lm.chat_prompts import prompt_text, with_system_prompt
from ..lm.multimodal import column_values, encode_prompt_parts, place_media
from ..lm.rollout_batches import concat_padded, eos_token_ids, first_eos_ends, full_width, units_before, used_width
from ..lm.vlm import load_image
from ..model_loading import DTYPES, load_tiny, pad_on_the_left
from .block_diffusion_sampler import sample_block_diffusion
from .block_diffusion_scoring import block_logprobs, encoder_inputs
from .config import DLMConfig, config_problems
from .outputs import TextRollouts

MASK_SEED_SALT = 0xD1  # the masked family's salt: a row's view seeds depend on its group seed alone


class DiffusionGemmaPolicy(TextRollouts, Policy):
    """`task: dlm` with `policy.family: diffusion_gemma` (built by `DLMPolicy`)."""

    Config = DLMConfig

    def __init__(self, cfg: DLMConfig):
        if not cfg.model:
            raise ValueError("policy.model must name a model (hub id, local path, or tiny:NAME)")
        if problems := config_problems(cfg):
            raise ValueError(problems[0])
        self.cfg = cfg
        if cfg.model.startswith("tiny:"):
            self.model, self.processor = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)
        else:
            from transformers import AutoProcessor, DiffusionGemmaForBlockDiffusion
            self.processor = AutoProcessor.from_pretrained(cfg.tokenizer or cfg.model,
                                                           trust_remote_code=cfg.trust_remote_code)
            self.model = DiffusionGemmaForBlockDiffusion.from_pretrained(cfg.model, dtype=DTYPES[cfg.dtype])
        self.tokenizer = self.processor.tokenizer
        pad_on_the_left(self.tokenizer)
        self.eos_ids = eos_token_ids(self.model, self.tokenizer)
        canvas = self.model.config.canvas_length
        if cfg.gen_length % canvas:
            raise ValueError(f"policy.gen_length={cfg.gen_length} must be a multiple of the model's canvas_length "
                             f"({canvas}): DiffusionGemma writes whole canvases")
        self.blocks = cfg.gen_length // canvas
        if cfg.device:
            self.model.to(cfg.device)
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()

    @property
    def max_units(self) -> int:
        return self.cfg.gen_length

    # ----- prompts ------------------------------------------------------------------------
    def _chat(self, row: Any) -> tuple[str, dict[str, Any]]:
        """A row's prompt text (its images' slots through the processor's chat template) and images."""
        images = [load_image(v) for v in column_values(row, self.cfg.image_column)]
        prompt = self.prompt_of(row)
        if not images:
            return prompt_text(self.tokenizer, prompt, self.cfg.chat_template, self.cfg.system_prompt), {}
        messages = with_system_prompt(place_media(prompt, [{"type": "image"} for _ in images]), self.cfg.system_prompt)
        chat = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return chat, {"images": images}

    def _encode(self, rows: Sequence[Any]) -> dict[str, Any]:
        return encode_prompt_parts(self.processor, self.tokenizer.pad_token_id, [self._chat(r) for r in rows])

    # ----- rollout ------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int],
                greedy: bool = False) -> Rollout:
        encoded = {k: (v.repeat_interleave(group_size, 0) if isinstance(v, Tensor)
                       else [x for x in v for _ in range(group_size)]) for k, v in self._encode(prompts).items()}
        device = self.device
        was_training = self.model.training
        self.model.eval()
        draw = sample_block_diffusion(
            self.model, encoded["prompt_ids"].to(device), encoded["prompt_mask"].to(device),
            encoder_inputs(encoded, device, self.model.dtype), self.cfg, self.blocks, self.eos_ids,
            self.tokenizer.pad_token_id, seeds, group_size, greedy)
        self.model.train(was_training)
        completion_ids = draw.completion_ids.cpu()
        unit_mask, truncated = units_before(first_eos_ends(completion_ids, self.eos_ids), completion_ids.shape[1])
        ends = unit_mask.sum(1).long().tolist()
        mask_seeds = torch.tensor([derive_seed(int(s), MASK_SEED_SALT, j) for s in seeds for j in range(group_size)])
        extras = {**encoded, "completion_ids": completion_ids, "final_canvas": draw.canvas.cpu(),
                  "self_conditioning": draw.self_conditioning.cpu(), "final_temperature": draw.temperature.cpu(),
                  "mask_seed": mask_seeds, "mask_pass": 0}
        return Rollout(
            group_id=torch.arange(len(prompts)).repeat_interleave(group_size),
            prompts=[self.prompt_of(p) for p in prompts for _ in range(group_size)],
            completions=[self.tokenizer.decode(ids[:n], skip_special_tokens=True)
                         for ids, n in zip(completion_ids, ends)],
            unit_mask=unit_mask, truncated=truncated, extras=extras,
            columns={"completion_ids": [ids[:n].tolist() for ids, n in zip(completion_ids, ends)]},
            rollout_logp=None if greedy else draw.logp.cpu() * unit_mask)

    def concat(self, parts: Sequence[Rollout]) -> Rollout:
        """Prompts left-padded to a common width; a part without images gets 0 rows of them per row."""
        empty = {k: v[0][:0] for p in parts for k, v in p.extras.items() if isinstance(v, list) and v}
        filled = [replace(p, extras={**{k: [e] * len(p) for k, e in empty.items()}, **p.extras}) for p in parts]
        return concat_padded(filled, self.tokenizer.pad_token_id)

    # ----- log-probs ----------------------------------------------------------------------
    def pass_view(self, batch: Rollout, pass_index: int) -> Rollout:
        """The batch with the noise of update pass `pass_index` (estimator diffu_grpo)."""
        return replace(batch, extras={**batch.extras, "mask_pass": pass_index})

    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        used = used_width(batch.unit_mask)
        logp, ent = block_logprobs(model, batch.extras, self.cfg.estimator, used, with_entropy)
        mask = batch.unit_mask[:, :used].to(logp.device)
        return full_width(logp * mask, ent * mask if ent is not None else None, batch.num_units, units)

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
        self.processor.save_pretrained(path)
