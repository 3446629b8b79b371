"""The model's output projection, for log-probs taken from the final hidden states
(`policy.logprobs_from: hidden_states`, `hidden_logprobs.py`).

The model runs whole, through whatever wraps it (LoRA, data parallelism), but while
`OutputHead.passing_hidden_states` is open its output projection returns its input: the forward
computes no logits, and the head keeps the hidden states it was given. `weight_and_bias` is the
projection the head applies: its weight and bias, plus the LoRA update B A x scaling of each
active adapter when the head is a LoRA layer, computed under autograd so that the adapter trains.

`unsupported_reason` names what this cannot reproduce; the adapters then take the logits path:
a model that transforms its logits after the head (Gemma 2's soft-capping, Cohere's logit scale),
a head that is not a linear layer, a LoRA head with dropout while training, bias or a variant
(DoRA), and a LoRA head whose parameters are sharded over processes. A plain head sharded over the
processes (by a strategy that shards parameters) is gathered whole for the log-probs' forward and
backward (`hidden_logprobs.py`, `ParallelView.whole`). Where the strategy's parameters are whole
only inside their module's call (`ParallelView.gathers_in_module_calls`), the log-probs run as a
call of the head module, so that the strategy's hooks gather its weight when the operation takes it
(autograd records its shape then) and again for its backward, until the gradient is accumulated and
reduced into the shards, as for the model's own head, tied to the input embedding or not.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from mmrl.core.parallel import ParallelView
from mmrl.errors import UserError

from .hidden_logprobs import hidden_state_logprobs

# config attributes of models that change the logits after the head, and their neutral values
LOGIT_TRANSFORMS = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0,
                    "output_multiplier_scale": 1.0}


def inner_model(model: nn.Module) -> nn.Module:
    """The model inside a data-parallel wrapper (which holds it as `module`)."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) else model


class OutputHead:
    """A model's output projection (`get_output_embeddings`), its parameters whole or sharded
    over the processes as `parallel` says."""

    def __init__(self, model: nn.Module, parallel: ParallelView | None = None):
        self.module = inner_model(model).get_output_embeddings()
        self.parallel = parallel or ParallelView()  # None: whole weights
        self.hidden: Tensor | None = None

    @staticmethod
    def unsupported_reason(model: nn.Module) -> str | None:
        """Why log-probs of `model` cannot come from its hidden states (None when they can)."""
        inner = inner_model(model)
        config = getattr(inner, "config", None)
        configs = [config, config.get_text_config(decoder=True)] if config is not None else []
        for attribute, neutral in LOGIT_TRANSFORMS.items():
            value = next((getattr(c, attribute) for c in configs if getattr(c, attribute, neutral) != neutral), neutral)
            if value != neutral:
                return f"the model transforms its logits after the head ({attribute}={value})"
        head = inner.get_output_embeddings()
        base = getattr(head, "base_layer", head)
        if not isinstance(base, nn.Linear):
            return f"the output head is a {type(head).__name__}, not a linear layer"
        if head is not base:
            return lora_head_reason(head)
        return None

    @staticmethod
    def sharded_reason(model: nn.Module) -> str | None:
        """Why log-probs of `model`, whose parameters are sharded over the processes, cannot come
        from its hidden states (None when they can: a plain head is gathered whole)."""
        head = inner_model(model).get_output_embeddings()
        if getattr(head, "base_layer", head) is not head:
            return "the output head is a LoRA layer and the parameters are sharded over the processes"
        return None

    @contextmanager
    def passing_hidden_states(self) -> Iterator["OutputHead"]:
        """While open, the head returns its input (and keeps it as `hidden`) instead of logits.
        A forward inside that never calls the head (a model that projects with the weight
        itself) is an error when the block closes: its logits would be taken for hidden states."""
        module = self.module
        self.hidden = None

        def keep(hidden: Tensor, *args, **kwargs) -> Tensor:
            return hidden

        def kept(head: nn.Module, args: tuple, output: Tensor) -> None:
            # the head's output as its other hooks leave it (a strategy's hooks may mark it for their backward)
            self.hidden = output

        hook = module.register_forward_hook(kept)
        try:
            with forward_replaced(module, keep):
                yield self
        finally:
            hook.remove()
        if self.hidden is None:
            raise UserError(f"policy.logprobs_from=hidden_states: the model ({type(module).__name__} head) computed "
                            "its output without calling its output head (get_output_embeddings); set "
                            "policy.logprobs_from: logits")

    def weight_and_bias(self) -> tuple[Tensor, Tensor | None]:
        """The weight [V, H] and bias [V] (or None) the head applies; with LoRA adapters, the base
        weight plus each active adapter's update, differentiable in A and B."""
        head = self.module
        base = getattr(head, "base_layer", head)
        weight = base.weight
        if head is not base and not head.disable_adapters and not head.merged:
            for name in head.active_adapters:
                if name in head.lora_A:
                    weight = weight + head.get_delta_weight(name).to(weight.dtype)
        return weight, base.bias

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the head projects in: its weight's, or for a sharded weight (fp32 master
        weights) that of the hidden states the sharded model computed."""
        weight = getattr(self.module, "base_layer", self.module).weight
        return weight.dtype if self.parallel.is_whole(weight) or self.hidden is None else self.hidden.dtype

    def logprobs(self, states: Tensor, targets: Tensor, temperature: float, chunk_tokens: int, with_entropy: bool,
                 banned: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """fp32 log-probs (and entropies) of `targets` [...] from hidden states [..., H] through the
        head (`hidden_state_logprobs`, its parameters gathered where sharded)."""
        def project(hidden: Tensor) -> tuple[Tensor, Tensor | None]:
            weight, bias = self.weight_and_bias()
            return hidden_state_logprobs(hidden, weight, targets, bias, temperature, chunk_tokens, with_entropy,
                                         banned, self.parallel)

        states = states.to(self.compute_dtype)
        if not self.parallel.gathers_in_module_calls:
            return project(states)
        with forward_replaced(self.module, project):
            return self.module(states)


@contextmanager
def forward_replaced(module: nn.Module, forward) -> Iterator[nn.Module]:
    """`module` calling `forward` instead of its own while the block runs (its hooks still run)."""
    own = module.__dict__.get("forward")  # an instance-level forward (accelerate's hooks) to put back
    module.forward = forward
    try:
        yield module
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def lora_head_reason(head: nn.Module) -> str | None:
    """Why a LoRA output head's projection is not W + B A scaling (None when it is)."""
    for name in head.active_adapters:
        if name not in head.lora_A:
            continue
        if name in getattr(head, "lora_variant", {}):
            return f"the output head's LoRA adapter {name!r} is a variant (DoRA)"
        if head.lora_B[name].bias is not None:
            return f"the output head's LoRA adapter {name!r} has a bias"
        dropout = head.lora_dropout[name]
        if head.training and isinstance(dropout, nn.Dropout) and dropout.p > 0:
            return f"the output head's LoRA adapter {name!r} has dropout {dropout.p} while training"
    return None
