"""Emu3 text-to-image as a policy (`task: emu3`): one unit per visual token.

`Emu3ForConditionalGeneration` (transformers) draws an image as rows of visual tokens (entries of
its `Emu3VQVAE` codebook, written as tokens of its one vocabulary) after the prompt and the image
header the processor writes (``<|image start|>H*W<|image token|>``), each row followed by the
end-of-line token; its documented generation constrains every position with a
`prefix_allowed_tokens_fn` (the visual tokens, or the one row end) and guides with
`UnbatchedClassifierFreeGuidanceLogitsProcessor` against a negative prompt. Here the units are the
H x W visual tokens; a row end, the one token its position allows (log-prob 0 under any policy), is
fed but is no unit. The sampling rule and a unit's log-prob (the log-softmax at the temperature of
the guided scores over the visual tokens) are `guided_tokens.py`'s; this module loads the model and
processor, writes the prompts and hands the sampler and the training forward the model's parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor, nn
from transformers import AutoProcessor, Emu3ForConditionalGeneration

from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS

from ..lm.output_head import inner_model
from ..model_loading import DTYPES, load_tiny, pretrained
from .guided_tokens import ImageTokenModel, decoded_pixels, image_token_logprobs, sample_image_tokens

# the negative prompt of the authors' image generation example (baaivision/Emu3, image_generation.py)
EMU3_NEGATIVE_PROMPT = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, "
                        "cropped, worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, "
                        "username, blurry.")
EXTRAS = ("prompt_ids", "prompt_mask", "negative_ids", "negative_mask", "image_tokens")


@dataclass
class Emu3ImageConfig:
    model: str = field(default="", metadata={"help": (
        "Hub id or local path of an Emu3ForConditionalGeneration checkpoint for image generation "
        "(BAAI/Emu3-Gen-hf), or tiny:emu3 for a tiny random one (tests, CPU runs).")})
    processor: str | None = field(default=None, metadata={"help": "Hub id or path of the Emu3Processor; null: the model's."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Passed to the processor's from_pretrained."})
    tiny_args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments of the tiny model builder when model is tiny:NAME (hidden, layers, heads, codebook, seed).")})
    dtype: str = field(default="float32", metadata={"help": (
        "Weights' dtype: float32, bfloat16 or float16 (log-probs are always computed in fp32)."),
        "choices": "mmrl.tasks.model_loading:DTYPES"})
    device: str | None = field(default=None, metadata={"help": "Move the model to this device (e.g. cuda:0); null: leave it."})
    prompt_template: str = field(default="{prompt}", metadata={"help": (
        "The text of the conditional row, {prompt} replaced by the row's prompt; the processor adds the bos "
        "token before it and the image header after it. The authors' example appends ' masterpiece, film "
        "grained, best quality.' to every prompt.")})
    negative_prompt: str = field(default=EMU3_NEGATIVE_PROMPT, metadata={"help": (
        "The text of the unconditional row, written as a prompt is (bos, text, image header): the "
        "authors' negative prompt by default; '' leaves the bos and the header alone.")})
    guidance_scale: float = field(default=3.0, metadata={"help": (
        "Classifier-free guidance scale s, as UnbatchedClassifierFreeGuidanceLogitsProcessor applies it "
        "(u + s (c - u) on the log-softmaxes; Emu3-Gen's generation default, 3); 1: no guidance.")})
    temperature: float = field(default=1.0, metadata={"help": (
        "Sampling temperature of the visual tokens (the guided scores divided by it).")})
    ratio: str = field(default="1:1", metadata={"help": (
        "The image's aspect ratio W:H, as the processor's `ratio` (it sets the tokens a row and the rows).")})
    image_area: int = field(default=518400, metadata={"help": (
        "The image's area in pixels as the processor's `image_area` (Emu3's default 518400: 720 x 720, 90 x 90 "
        "visual tokens at 8 pixels a token); tiny:emu3 draws 4 x 4 tokens at 1024.")})


@ADAPTERS.register("emu3")
class Emu3Policy(Policy):
    """Text-to-image with Emu3: units are the visual tokens (module docstring); `extras` hold the
    prompt ids and mask [N, L], the negative prompt's ids and mask [N, L], and the visual tokens
    [N, H x W] as codebook indices."""

    Config = Emu3ImageConfig
    # the VQ-VAE takes no part in drawing: frozen in a full fine-tune, but LoRA on all linear layers
    # gives its attention adapters that get no gradient
    partial_backward = True

    def __init__(self, cfg: Emu3ImageConfig):
        self.cfg = cfg
        if cfg.model.startswith("tiny:"):
            self.model, self.processor = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype)
        else:
            self.model = pretrained(Emu3ForConditionalGeneration, cfg.model, dtype=DTYPES[cfg.dtype])
            self.processor = AutoProcessor.from_pretrained(cfg.processor or cfg.model,
                                                           trust_remote_code=cfg.trust_remote_code)
        self.processor.tokenizer.padding_side = "left"
        if cfg.device:
            self.model.to(cfg.device)
        self.emu3.model.vqmodel.requires_grad_(False)  # frozen, as Emu3 trains it
        mapping = self.emu3.model.vocabulary_mapping
        if mapping.eol_token_id is None or not mapping.image_tokens:
            raise UserError(f"policy.model={cfg.model}: its vocabulary_map has no <|extra_200|> row end or no "
                            "<|visual token ...|> tokens; is it an Emu3 checkpoint?")
        self.visual = mapping.img2bpe_mapping_tensor.long()  # [codebook]: the vocabulary id of each entry
        self.row_end = mapping.eol_token_id
        self.height, self.width = self.processor.calculate_generate_size(cfg.ratio, cfg.image_area,
                                                                          self.processor.downsample_ratio)

    @classmethod
    def config_problems(cls, cfg: Emu3ImageConfig) -> list[str]:
        problems = []
        if cfg.guidance_scale < 1.0:
            problems.append(f"policy.guidance_scale={cfg.guidance_scale}: must be >= 1 (1: no guidance)")
        if cfg.temperature <= 0:
            problems.append(f"policy.temperature={cfg.temperature}: must be > 0")
        if "{prompt}" not in cfg.prompt_template:
            problems.append(f"policy.prompt_template={cfg.prompt_template!r}: must contain {{prompt}}")
        w, _, h = cfg.ratio.partition(":")
        if not (w.isdigit() and h.isdigit() and int(w) > 0 and int(h) > 0):
            problems.append(f"policy.ratio={cfg.ratio!r}: must be W:H with positive whole numbers (1:1, 16:9)")
        elif cfg.image_area < 64 * max(int(w) / int(h), int(h) / int(w)):
            problems.append(f"policy.image_area={cfg.image_area}: too small for one visual token a side at ratio {cfg.ratio}")
        return problems

    @classmethod
    def memory_model(cls, cfg: Emu3ImageConfig, prompt_length: int):
        """Refused by name: Janus's formula (tasks/ar_image/memory_formula.py) does not carry over
        (Emu3 scores the whole vocabulary with its text head, feeds a row end per row, and decodes
        with a 3-D VQ-VAE), and no probe has measured Emu3's step yet."""
        raise UserError(f"mmrl plan: the adapter {cls.__name__} (Emu3 text-to-image) has no memory formula yet; "
                        "its memory is not planned")

    @classmethod
    def prompt_check(cls, cfg: Emu3ImageConfig):
        """A prompt is text: it goes through `policy.prompt_template`, not a chat template."""
        def check(prompt: Any) -> str | None:
            return None if isinstance(prompt, str) else (
                f"a {type(prompt).__name__} prompt: task emu3 takes text prompts, written into policy.prompt_template")
        return check

    @classmethod
    def output_kind(cls, cfg: Emu3ImageConfig) -> str:
        return "image"

    @property
    def max_units(self) -> int:
        return self.height * self.width

    @property
    def emu3(self) -> Emu3ForConditionalGeneration:
        """The Emu3 model inside the LoRA wrapper, if any."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def parts(self, model: nn.Module) -> ImageTokenModel:
        """The sampler's and the training pass's view of `model` (the training-wrapped module or another
        copy): scores are the text head's logits at the visual tokens, in codebook order."""
        wrapped = inner_model(model)
        emu3 = wrapped.get_base_model() if hasattr(wrapped, "get_base_model") else wrapped
        embed = emu3.get_input_embeddings()
        visual = self.visual.to(embed.weight.device)

        def decoder(embeds: Tensor, mask: Tensor, pos: Tensor, cache: Any) -> Tensor:
            return emu3.model.text_model(inputs_embeds=embeds, attention_mask=mask, position_ids=pos,
                                         cache=cache, use_cache=True).last_hidden_state

        def scores(ids: Tensor, mask: Tensor, pos: Tensor, keep: int) -> Tensor:
            return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                         logits_to_keep=keep).logits[..., visual]

        return ImageTokenModel(decoder=decoder, text_embeddings=embed, image_embeddings=lambda t: embed(visual[t]),
                               head=lambda hidden: emu3.lm_head(hidden)[..., visual], scores=scores,
                               input_ids=lambda t: visual[t], row_width=self.width, row_end=self.row_end)

    def encode(self, prompts: Sequence[Any]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Left-padded ids and masks [P, L] of the prompts and of the negative prompt (one length for
        both), each as the processor writes it for image generation: bos, text, image header."""
        texts = [self.cfg.prompt_template.format(prompt=self.prompt_of(p)) for p in prompts]
        enc = self.processor(text=texts + [self.cfg.negative_prompt] * len(texts), return_for_image_generation=True,
                             ratio=self.cfg.ratio, image_area=self.cfg.image_area, padding=True, return_tensors="pt")
        ids, neg_ids = enc["input_ids"].chunk(2)
        mask, neg_mask = enc["attention_mask"].chunk(2)
        return ids, mask, neg_ids, neg_mask

    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int], greedy: bool = False) -> Rollout:
        x = dict(zip(EXTRAS, (t.repeat_interleave(group_size, 0).to(self.device) for t in self.encode(prompts))))
        generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            tokens, logp = sample_image_tokens(
                self.parts(self.model), torch.cat([x["prompt_ids"], x["negative_ids"]]),
                torch.cat([x["prompt_mask"], x["negative_mask"]]), self.max_units, self.cfg.guidance_scale,
                self.cfg.temperature, generators, group_size, greedy)
            pixels = self.emu3.model.vqmodel.decode(tokens.view(-1, self.height, self.width))  # [N, 3, H', W']
        self.model.train(was_training)
        n = len(tokens)
        return Rollout(group_id=torch.arange(len(prompts)).repeat_interleave(group_size),
                       prompts=[self.prompt_of(p) for p in prompts for _ in range(group_size)],
                       completions=decoded_pixels(pixels.permute(0, 2, 3, 1)),
                       unit_mask=torch.ones(n, self.max_units),
                       extras={**{k: v.cpu() for k, v in x.items()}, "image_tokens": tokens.cpu()},
                       rollout_logp=None if greedy else logp.float().cpu())

    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        device = next(model.parameters()).device
        x = {k: batch.extras[k].to(device) for k in EXTRAS}
        return image_token_logprobs(self.parts(model), torch.cat([x["prompt_ids"], x["negative_ids"]]),
                                    torch.cat([x["prompt_mask"], x["negative_mask"]]), x["image_tokens"], units,
                                    self.cfg.guidance_scale, self.cfg.temperature, with_entropy)
