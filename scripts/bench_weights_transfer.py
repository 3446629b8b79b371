"""The rollout worker's weights transfer (docs/async.md): the text demo's model (its `tiny_args`, or
--hidden / --layers) sent --repeats times from this process to a spawned one that builds the same
model, over the broadcast the worker uses (mmrl/serving/weights_broadcast.py) and, for comparison,
as a CPU state dict through a multiprocessing queue (the transport before it, rebuilt here).

With --lora-r R the model carries the engine's LoRA of rank R (`mmrl.core.lora.with_lora`, alpha 2R,
every linear layer), as a LoRA run's trainer and worker do, and three ways of sending it are compared
over the broadcast: `whole` (the state dict, base weights and adapter, every time), `adapter` (the
trained tensors alone: what the worker takes after its first transfer) and `merged` (the trainer
computes W + (alpha / r) B A for every adapted layer, `merge_ms`, and sends the base-sized weights: the
transfer is timed on the base weights' broadcast, of the same size).

Per transfer: `send_ms`, how long the sender is held, and `latency_ms`, from the send until the
receiver has the weights in its model (its acknowledgement through a queue included), and `bytes`;
medians over the repeats after the first, and the load average before and after. Both processes on
one torch thread, on the CPU."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from bench_report import emit

# the model's size: (hidden, layers, LoRA rank)
Sizes = tuple[int | None, int | None, int]


def demo_model(sizes: Sizes) -> torch.nn.Module:
    from mmrl.config.parse import load_recipe
    from mmrl.core.lora import with_lora
    from mmrl.core.policy import build_policy
    from mmrl.registry import RECIPES, load_plugins
    load_plugins()
    hidden, layers, lora_r = sizes
    overrides = [f"policy.tiny_args.{name}={value}" for name, value in (("hidden", hidden), ("layers", layers)) if value]
    overrides += [f"optim.lora.r={lora_r}", f"optim.lora.alpha={2 * lora_r}"] if lora_r else []
    cfg = load_recipe(RECIPES.get("text_demo"), overrides)
    return with_lora(build_policy(cfg).model, cfg.optim.lora)


def layouts(model: torch.nn.Module) -> dict:
    """The parts sent: the worker's two (`transfer_layouts`: `whole` is WHOLE) and, with LoRA, the
    merged weights' size."""
    from mmrl.serving.weights_broadcast import TRAINED, WHOLE, transfer_layouts
    parts = transfer_layouts(model)
    base = [entry for entry in parts[WHOLE] if ".lora_" not in entry[0]]
    return {WHOLE: parts[WHOLE], "adapter": parts[TRAINED], "merged": base}


def receive(transport: str, sizes: Sizes, port: int, parts: dict, inbox: mp.Queue, acks: mp.Queue) -> None:
    """The receiving process: each message is a transfer (a state dict, or the part broadcast) to take
    into its model, then acknowledge."""
    from mmrl.serving.weights_broadcast import WeightsReceiver
    torch.set_num_threads(1)
    model = demo_model(sizes)
    receiver = None if transport == "queue" else WeightsReceiver(port, parts, model, torch.device("cpu"))
    while (message := inbox.get()) is not None:
        if receiver is None:
            model.load_state_dict(message)
        else:
            receiver.receive(message)
        acks.put(time.perf_counter())


def merged_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """W + (alpha / r) B A of every adapted linear layer (what a merged transfer sends), computed as
    peft merges an adapter."""
    from peft.tuners.lora import LoraLayer
    out = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, LoraLayer):
                out[name] = module.get_base_layer().weight + module.get_delta_weight(module.active_adapters[0])
    return out


def measure(transport: str, part: str, model: torch.nn.Module, sizes: Sizes, repeats: int) -> dict:
    from mmrl.serving.weights_broadcast import WeightsSender, transfer_bytes
    parts = layouts(model)
    context = mp.get_context("spawn")
    inbox, acks = context.Queue(), context.Queue()
    sender = None if transport == "queue" else WeightsSender(parts)
    process = context.Process(target=receive, args=(transport, sizes, sender.port if sender else 0, parts, inbox,
                                                    acks), daemon=True)
    process.start()
    if sender is not None:
        sender.connect(torch.device("cpu"), lambda: time.sleep(0.05))
    send_ms, latency_ms, merge_ms = [], [], []
    for _ in range(repeats):
        started = time.perf_counter()
        if sender is None:
            inbox.put({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        else:
            if part == "merged":
                merged_weights(model)
                merge_ms.append(1000 * (time.perf_counter() - started))
            sender.send(model, part)
            inbox.put(part)
        sent = time.perf_counter()
        received = acks.get()
        send_ms.append(1000 * (sent - started))
        latency_ms.append(1000 * (received - started))
    inbox.put(None)
    process.join()
    if sender is not None:
        sender.release_sent()
        sender.close()
    report = {"send_ms": statistics.median(send_ms[1:]), "latency_ms": statistics.median(latency_ms[1:]),
              "bytes": transfer_bytes(parts[part])}
    if merge_ms:
        report["merge_ms"] = statistics.median(merge_ms[1:])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--hidden", type=int, help="policy.tiny_args.hidden (the demo's: 128)")
    parser.add_argument("--layers", type=int, help="policy.tiny_args.layers (the demo's: 2)")
    parser.add_argument("--lora-r", type=int, default=0, help="LoRA rank (alpha 2r, every linear layer); 0: none")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error(f"--repeats {args.repeats} must be 2 or more (the first is left out)")
    if args.lora_r < 0:
        parser.error(f"--lora-r {args.lora_r} must be 0 or more")
    torch.set_num_threads(1)
    sizes = (args.hidden, args.layers, args.lora_r)
    model = demo_model(sizes)
    report = {"parameters": sum(p.numel() for p in model.parameters()),
              "trained_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
              "state_dict_mb": sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20,
              "load_average_before": os.getloadavg()[0]}
    # (the report's key, transport, part)
    cases = [(part, "broadcast", part) for part in ("whole", "adapter", "merged")] if args.lora_r else \
        [("queue", "queue", "whole"), ("broadcast", "broadcast", "whole")]
    report.update({key: measure(transport, part, model, sizes, args.repeats) for key, transport, part in cases})
    for part in ("adapter", "merged"):
        if part in report:
            report[part]["latency_ratio_to_whole"] = report[part]["latency_ms"] / report["whole"]["latency_ms"]
    report["load_average_after"] = os.getloadavg()[0]
    emit(report, args.json)


if __name__ == "__main__":
    main()
