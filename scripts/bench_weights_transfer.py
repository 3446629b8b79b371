"""The rollout worker's weights transfer (docs/async.md): the text demo's model (its `tiny_args`, or
--hidden / --layers) sent --repeats times from this process to a spawned one that builds the same
model, over the broadcast the worker uses (mmrl/serving/weights_broadcast.py) and, for comparison,
as a CPU state dict through a multiprocessing queue (the transport before it, rebuilt here). Per
transfer: `send_ms`, how long the sender is held, and `latency_ms`, from the send until the
receiver has the weights in its model (its acknowledgement through a queue included); medians
over the repeats after the first, and the load average before and after. Both processes on one
torch thread, on the CPU."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from bench_report import emit

TRANSPORTS = ("queue", "broadcast")


def demo_model(hidden: int | None, layers: int | None) -> torch.nn.Module:
    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES, load_plugins
    from mmrl.train.loop.parts import build_policy
    load_plugins()
    overrides = [f"policy.tiny_args.{name}={value}" for name, value in (("hidden", hidden), ("layers", layers)) if value]
    return build_policy(load_recipe(RECIPES.get("text_demo"), overrides)).model


def receive(transport: str, sizes: tuple, port: int, layout, inbox: mp.Queue, acks: mp.Queue) -> None:
    """The receiving process: each message is a transfer to take into its model, then acknowledge."""
    from mmrl.serving.weights_broadcast import WeightsReceiver
    torch.set_num_threads(1)
    model = demo_model(*sizes)
    receiver = WeightsReceiver(port, layout, model, torch.device("cpu")) if transport == "broadcast" else None
    while (message := inbox.get()) is not None:
        if receiver is None:
            model.load_state_dict(message)
        else:
            receiver.receive()
        acks.put(time.perf_counter())


def measure(transport: str, model: torch.nn.Module, sizes: tuple, repeats: int) -> dict:
    from mmrl.serving.weights_broadcast import WeightsSender, layout_of
    context = mp.get_context("spawn")
    inbox, acks = context.Queue(), context.Queue()
    sender = WeightsSender() if transport == "broadcast" else None
    process = context.Process(target=receive, args=(transport, sizes, sender.port if sender else 0,
                                                    layout_of(model.state_dict()), inbox, acks), daemon=True)
    process.start()
    if sender is not None:
        sender.connect(torch.device("cpu"), lambda: time.sleep(0.05))
    send_ms, latency_ms = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        if sender is None:
            inbox.put({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        else:
            sender.send(model)
            inbox.put(True)
        sent = time.perf_counter()
        received = acks.get()
        send_ms.append(1000 * (sent - started))
        latency_ms.append(1000 * (received - started))
    inbox.put(None)
    process.join()
    if sender is not None:
        sender.release_sent()
        sender.close()
    return {"send_ms": statistics.median(send_ms[1:]), "latency_ms": statistics.median(latency_ms[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--hidden", type=int, help="policy.tiny_args.hidden (the demo's: 128)")
    parser.add_argument("--layers", type=int, help="policy.tiny_args.layers (the demo's: 2)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error(f"--repeats {args.repeats} must be 2 or more (the first is left out)")
    torch.set_num_threads(1)
    sizes = (args.hidden, args.layers)
    model = demo_model(*sizes)
    report = {"parameters": sum(p.numel() for p in model.parameters()),
              "state_dict_mb": sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20,
              "load_average_before": os.getloadavg()[0]}
    report.update({transport: measure(transport, model, sizes, args.repeats) for transport in TRANSPORTS})
    report["load_average_after"] = os.getloadavg()[0]
    emit(report, args.json)


if __name__ == "__main__":
    main()
