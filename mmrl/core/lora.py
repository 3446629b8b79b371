"""The engine's LoRA (`optim.lora`): a policy's model wrapped with peft adapters. The trainer wraps
the model it trains (mmrl/train/loop/parts.py) and the rollout worker its copy
(mmrl/train/placement/worker_process.py) with this one function, so that both hold the same modules
under the same names and the worker can take the adapter's tensors alone (docs/async.md)."""

from __future__ import annotations

import warnings

from torch import nn

from mmrl.config.sections import LoraConfig


def with_lora(model: nn.Module, lora: LoraConfig) -> nn.Module:
    """`model` with LoRA adapters of rank `lora.r` on `lora.target_modules` (peft's `PeftModel`, whose
    base weights are frozen and whose adapters train); `model` itself unchanged where `lora.r` is 0."""
    if lora.r == 0:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    with warnings.catch_warnings():  # peft (0.21) itself reads transformers' deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        return get_peft_model(model, PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                    target_modules=lora.target_modules))
