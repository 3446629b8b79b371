"""Janus / Janus-Pro writing text as a policy (`task: janus_text`): one unit per text token, drawn
through the unified model's language head (`JanusForConditionalGeneration` in text mode).

Everything but the loading and the text-mode `generate` is `causal_lm`'s (prompts, the seeded
sampler, the fp32 token log-probs of the training forward, which runs Janus's own forward: its
text embeddings, decoder and `lm_head`). Janus's `generate` in text mode hands its arguments to
transformers' `GenerationMixin.generate` without the logits processors it is given (transformers
5.24), so the seeded sampler would never run and a rollout would be greedy; the model's `generate`
is therefore that of text mode with the processors kept (and no classifier-free guidance, as
Janus's own text mode). In a composite with `policy.shared_weights` this is the thinker whose
module the `janus` generator draws with (T2I-R1's semantic-level chain of thought).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn
from transformers import GenerationMixin, JanusForConditionalGeneration

from mmrl.registry import ADAPTERS

from ..lm.causal_lm import CausalLMConfig, CausalLMPolicy
from ..model_loading import DTYPES, load_tiny, load_tokenizer, pretrained


def text_mode_generate(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """`model.generate` in Janus's text mode (no guidance) with every argument kept, the logits
    processors included."""
    return GenerationMixin.generate(model, *args, guidance_scale=None, **kwargs)


@ADAPTERS.register("janus_text")
class JanusTextPolicy(CausalLMPolicy):
    """`causal_lm` on a `JanusForConditionalGeneration` (module docstring)."""

    Config = CausalLMConfig
    runs_in_rollout_worker = False  # not run in the asynchronous rollout worker (untested there)

    @classmethod
    def config_problems(cls, cfg: CausalLMConfig) -> list[str]:
        problems = super().config_problems(cfg)
        if cfg.rollout_engine != "hf":
            problems.append(f"policy.rollout_engine={cfg.rollout_engine}: task janus_text samples with transformers' "
                            "generate (hf); the vLLM engine does not load Janus's unified model")
        return problems

    def _load(self, cfg: CausalLMConfig) -> None:
        """Set `model` (a Janus checkpoint, or tiny:janus) and `tokenizer`; the model's `generate` is
        text mode's with the logits processors kept (`text_mode_generate`)."""
        if cfg.model.startswith("tiny:"):
            self.model, self.tokenizer = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype, cfg.attn_implementation)
        else:
            self.tokenizer = load_tokenizer(cfg)
            self.model = pretrained(JanusForConditionalGeneration, cfg.model, dtype=DTYPES[cfg.dtype],
                                    attn_implementation=cfg.attn_implementation)
        self.model.generate = partial(text_mode_generate, self.model)
