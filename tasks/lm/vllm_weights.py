"""The policy's weights as a vLLM engine loads them (`vllm_engine.py`'s weight sync): under the
base model's parameter names, LoRA merged aside, a sharded model one shard unit at a time;
and the fingerprint that tells whether they changed since the last sync."""

from __future__ import annotations

from typing import Iterator

from torch import Tensor, nn

from mmrl.core.parallel import ParallelView


def export_weights(model: nn.Module, parallel: ParallelView) -> Iterator[tuple[str, Tensor]]:
    """The policy's weights under the base model's parameter names, as vLLM's ``load_weights``
    takes them: a plain model's own tensors (its persistent buffers first, then its parameters,
    tied ones under each of their names, as in its state dict), or for a PEFT LoRA model the
    merged W + delta of each adapted layer (computed aside; the trained module is left untouched).

    A sharded model is read one shard unit at a time (`parallel.weights_in_turn`, the policy's view
    of the run's distribution): each unit is gathered, its weights are yielded as copies in the
    compute dtype (whole, LoRA merged as above) and the unit is freed before the next, so besides the
    shards one unit's weights exist at a time; every process must consume the iterator to the end,
    in step. Parameters already gathered are read as they are."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    prefix = next(name for name, module in model.named_modules() if module is base)
    prefix = f"{prefix}." if prefix else ""
    lora_layer = None
    if base is not model:
        from peft.tuners.lora import LoraLayer as lora_layer
    for path, module in base.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and name not in module._non_persistent_buffers_set:
                yield f"{path}.{name}" if path else name, buffer.detach()

    def whole(tensor: Tensor, name: str) -> Tensor:
        if not parallel.is_whole(tensor):  # a unit holding a parameter another unit's module uses (a tie across units)
            raise RuntimeError(f"vLLM weight sync: {name} is still sharded while its shard unit is gathered; "
                               "choose distributed.shard_modules so that tied or LoRA weights share a unit")
        return tensor.detach()

    for names, gathered_here in parallel.weights_in_turn(model):
        params = dict(model.named_parameters(remove_duplicate=False))  # this unit's whole, the others' shards
        for full_name in names:
            if not full_name.startswith(prefix) or ".lora_" in full_name:
                continue
            name = full_name[len(prefix):]
            tensor = whole(params[full_name], name)
            if ".base_layer." in name:
                owner, _, leaf = name.rpartition(".base_layer.")
                module = base.get_submodule(owner)
                active = [a for a in module.active_adapters if a in module.lora_A] \
                    if lora_layer is not None and isinstance(module, lora_layer) else []
                if leaf == "weight" and active:
                    for adapter in active:
                        whole(module.lora_A[adapter].weight, f"{owner}.lora_A")
                        whole(module.lora_B[adapter].weight, f"{owner}.lora_B")
                    delta = sum(module.get_delta_weight(a) for a in active)
                    tensor = tensor + delta.to(tensor.dtype)  # a new tensor: nothing to copy
                elif gathered_here:
                    tensor = tensor.clone()
                name = f"{owner}.{leaf}"
            elif gathered_here:
                tensor = tensor.clone()  # the unit's gathered storage is freed before the next one
            yield name, tensor


def weights_fingerprint(model: nn.Module, parallel: ParallelView) -> tuple:
    """Changes whenever a parameter is written in place by an op that bumps its version counter
    (load_state_dict, ``add_``) or is replaced. Fused optimizer steps (``AdamW(fused=True)``, the
    trainer's) do not bump it: those are seen by the optimizer step hook of `VLLMEngine`."""
    return tuple((id(p), parallel.local(p).data_ptr(), p._version) for p in model.parameters())
