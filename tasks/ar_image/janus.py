"""Janus / Janus-Pro text-to-image as a policy (`task: janus`): one unit per image token.

`JanusForConditionalGeneration` (transformers) draws an image as a fixed number of VQ tokens
after the prompt and its begin-of-image token, under classifier-free guidance; the VQ decoder
makes them an image, which the rewards score. The sampling rule and the log-prob of a unit (the
log-softmax of the guided logits at the temperature) are `guided_tokens.py`'s; this module loads
the model, writes the prompts and hands the sampler and the training forward the model's parts.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor, nn
from transformers import JanusForConditionalGeneration

from mmrl.core.rollout import Rollout
from mmrl.core.policy import Policy
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS

from ..lm.output_head import forward_replaced, inner_model
from ..model_loading import DTYPES, load_tiny, load_tokenizer, pad_on_the_left, pretrained
from .memory_formula import JanusMemory, frozen_parts, janus_memory
from .guided_tokens import (
    ImageTokenModel,
    decoded_pixels,
    image_token_logprobs,
    sample_image_tokens,
    unconditional_ids,
)


@dataclass
class JanusConfig:
    model: str = field(default="", metadata={"help": (
        "Hub id or local path of a JanusForConditionalGeneration checkpoint (deepseek-community/Janus-Pro-1B, "
        "-7B), or tiny:janus for a tiny random one (tests, CPU runs).")})
    tokenizer: str | None = field(default=None, metadata={"help": "Hub id or path of the tokenizer; null: the model's."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Passed to the tokenizer's from_pretrained."})
    tiny_args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments of the tiny model builder when model is tiny:NAME (hidden, layers, codebook, patches, seed).")})
    dtype: str = field(default="float32", metadata={"help": (
        "Weights' dtype: float32, bfloat16 or float16 (log-probs are always computed in fp32)."),
        "choices": "mmrl.tasks.model_loading:DTYPES"})
    device: str | None = field(default=None, metadata={"help": "Move the model to this device (e.g. cuda:0); null: leave it."})
    prompt_template: str = field(default="{prompt}", metadata={"help": (
        "The text before the begin-of-image token, {prompt} replaced by the row's prompt; Janus-Pro's own "
        "generation format is '<|User|>: {prompt}\\n\\n<|Assistant|>:'. The tokenizer adds its special tokens (bos).")})
    guidance_scale: float = field(default=5.0, metadata={"help": (
        "Classifier-free guidance scale s of the image tokens' logits, u + s (c - u) (Janus's generate default, "
        "5); 1: no guidance (the conditional logits alone).")})
    temperature: float = field(default=1.0, metadata={"help": (
        "Sampling temperature of the image tokens (the guided logits divided by it).")})


@ADAPTERS.register("janus")
class JanusPolicy(Policy):
    """Text-to-image with Janus: units are the image tokens (module docstring); `extras` hold the
    prompt ids [N, L], their mask and unconditional ids [N, L], and the image tokens [N, T]."""

    Config = JanusConfig
    # the image-understanding encoder takes no part in drawing: frozen in a full fine-tune, but LoRA on
    # all linear layers gives it adapters that get no gradient
    partial_backward = True
    runs_in_rollout_worker = True  # its rollouts need the model alone

    def __init__(self, cfg: JanusConfig):
        self.cfg = cfg
        if cfg.model.startswith("tiny:"):
            self.model, self.tokenizer = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)
        else:
            self.model = pretrained(JanusForConditionalGeneration, cfg.model, dtype=DTYPES[cfg.dtype])
            self.tokenizer = load_tokenizer(cfg)
        pad_on_the_left(self.tokenizer)
        if cfg.device:
            self.model.to(cfg.device)
        for unused in frozen_parts(self.model):  # the VQ model, as Janus trains it; the understanding encoder
            unused.requires_grad_(False)
        gen = self.model.generation_config
        self.boi_id = (gen.generation_kwargs or {}).get("boi_token_id", getattr(self.tokenizer, "boi_token_id", None))
        if self.boi_id is None:
            raise UserError(f"policy.model={cfg.model}: no begin-of-image token (generation_config.generation_kwargs"
                            ".boi_token_id, or the tokenizer's boi_token); is it a Janus checkpoint?")
        self.kept_ids = [i for i in (gen.bos_token_id, self.boi_id) if i is not None]
        self.pad_id = gen.pad_token_id if gen.pad_token_id is not None else self.tokenizer.pad_token_id
        self.num_tokens = self.model.config.vision_config.num_image_tokens

    @classmethod
    def config_problems(cls, cfg: JanusConfig) -> list[str]:
        problems = []
        if cfg.guidance_scale < 1.0:
            problems.append(f"policy.guidance_scale={cfg.guidance_scale}: must be >= 1 (1: no guidance)")
        if cfg.temperature <= 0:
            problems.append(f"policy.temperature={cfg.temperature}: must be > 0")
        if "{prompt}" not in cfg.prompt_template:
            problems.append(f"policy.prompt_template={cfg.prompt_template!r}: must contain {{prompt}}")
        return problems

    @classmethod
    def memory_model(cls, cfg: JanusConfig, prompt_length: int) -> JanusMemory:
        """tasks/ar_image/memory_formula.py: the image's tokens under guidance (twice the rows), the
        VQ decode of the rollouts' images; `prompt_length` counts the template and the begin-of-image token."""
        return janus_memory(cfg, prompt_length)

    @classmethod
    def prompt_check(cls, cfg: JanusConfig):
        """A prompt is text: it goes through `policy.prompt_template`, not a chat template."""
        def check(prompt: Any) -> str | None:
            return None if isinstance(prompt, str) else (
                f"a {type(prompt).__name__} prompt: task janus takes text prompts, written into policy.prompt_template")
        return check

    @classmethod
    def output_kind(cls, cfg: JanusConfig) -> str:
        return "image"

    @property
    def max_units(self) -> int:
        return self.num_tokens

    def parts(self, model: nn.Module) -> ImageTokenModel:
        """The sampler's and the training pass's view of `model` (the training-wrapped module or another copy)."""
        wrapped = inner_model(model)
        janus = wrapped.get_base_model() if hasattr(wrapped, "get_base_model") else wrapped
        offset = janus.get_input_embeddings().num_embeddings

        def decoder(embeds: Tensor, mask: Tensor, pos: Tensor, cache: Any) -> Tensor:
            return janus.model.language_model(inputs_embeds=embeds, attention_mask=mask, position_ids=pos,
                                              cache=cache, use_cache=True).last_hidden_state

        def scores(ids: Tensor, mask: Tensor, pos: Tensor, keep: int) -> Tensor:
            with image_tokens_in(janus, offset):  # through the wrappers (LoRA, data parallelism)
                return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                             logits_to_keep=keep).logits

        return ImageTokenModel(decoder=decoder, text_embeddings=janus.get_input_embeddings(),
                               image_embeddings=janus.prepare_embeddings_for_image_generation,
                               head=janus.model.generation_head, scores=scores,
                               input_ids=lambda tokens: tokens + offset)

    def encode(self, prompts: Sequence[Any]) -> tuple[Tensor, Tensor]:
        """Left-padded prompt ids and mask [P, L]: the template, then the begin-of-image token."""
        boi = self.tokenizer.convert_ids_to_tokens(self.boi_id)
        texts = [self.cfg.prompt_template.format(prompt=self.prompt_of(p)) + boi for p in prompts]
        enc = self.tokenizer(texts, padding=True, return_tensors="pt")
        return enc["input_ids"], enc["attention_mask"]

    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int], greedy: bool = False) -> Rollout:
        ids, mask = (t.repeat_interleave(group_size, 0).to(self.device) for t in self.encode(prompts))
        uncond = unconditional_ids(ids, self.kept_ids, self.pad_id)
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            tokens, logp = sample_image_tokens(self.parts(self.model), torch.cat([ids, uncond]),
                                               torch.cat([mask, mask]), self.num_tokens,
                                               self.cfg.guidance_scale, self.cfg.temperature, generators,
                                               group_size, greedy)
            images = decoded_pixels(self.janus.decode_image_tokens(tokens))
        self.model.train(was_training)
        n = len(ids)
        return Rollout(group_id=torch.arange(len(prompts)).repeat_interleave(group_size),
                       prompts=[self.prompt_of(p) for p in prompts for _ in range(group_size)], completions=images,
                       unit_mask=torch.ones(n, self.num_tokens),
                       extras={"prompt_ids": ids.cpu(), "prompt_mask": mask.cpu(), "uncond_ids": uncond.cpu(),
                               "image_tokens": tokens.cpu()},
                       rollout_logp=None if greedy else logp.float().cpu())

    @property
    def janus(self) -> JanusForConditionalGeneration:
        """The Janus model inside the LoRA wrapper, if any."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        device = next(model.parameters()).device
        x = {k: batch.extras[k].to(device) for k in ("prompt_ids", "prompt_mask", "uncond_ids", "image_tokens")}
        return image_token_logprobs(self.parts(model), torch.cat([x["prompt_ids"], x["uncond_ids"]]),
                                    torch.cat([x["prompt_mask"]] * 2), x["image_tokens"], units, self.cfg.guidance_scale,
                                    self.cfg.temperature, with_entropy)


@contextmanager
def image_tokens_in(janus: JanusForConditionalGeneration, offset: int) -> Iterator[None]:
    """While the block runs, Janus's forward reads image tokens and scores them: its input embedding
    takes ids from `offset` on as image tokens (`offset` + token, embedded by the generation
    embeddings and aligner), and its text head is the generation head."""
    embedding = janus.get_input_embeddings()
    own = type(embedding).forward

    def embed(ids: Tensor) -> Tensor:
        image = ids >= offset
        text = own(embedding, ids.clamp(max=offset - 1))
        drawn = janus.prepare_embeddings_for_image_generation(ids[image] - offset)
        return text.masked_scatter(image[..., None], drawn.to(text.dtype))

    # the head given through a function: a module set as `forward` would become a child module instead
    with forward_replaced(embedding, embed), forward_replaced(janus.lm_head, lambda hidden: janus.model.generation_head(hidden)):
        yield
