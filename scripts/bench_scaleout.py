"""Served rollouts scaled out on a local Ray cluster of CPU workers (docs/distributed.md#served-rollouts):
trained samples / s against the number of rollout servers, with the synchronous single-process run as the
baseline in the same run; and the weights push's time against the model's size, with a naive handover
through a file (save, load) beside it.

Throughput: the text demo's recipe (its supervised warm start shortened to --warm-start-steps, untimed, so
rewards vary and every step trains), --steps RL steps of --prompts prompt groups x 8, the first --warmup left
out; trained samples / s from the steps' own times (`time_step_s`); `wall_s` is the whole command's
(the processes' start, the warm start, the model builds included). `single` is `mmrl train` in one process
on one torch thread, as every role of the served runs (with a torch thread per core on a shared, loaded
2-core machine, the single run's threads oversubscribe the cores and it was 25 times slower: a baseline
that measures the contention, not the engine); `served_N` is `mmrl train --ray` with one trainer rank and N rollout servers
(`policy.rollout_engine: hf_server`, `rollout.mode` --mode at --staleness), each generation call of
--groups-per-call groups a request, every role on one torch thread (OMP_NUM_THREADS=1), on a cluster of a head
and two worker nodes started here (`ray.cluster_utils.Cluster`).

Weights push: for each --push-size HIDDENxLAYERS, an `mmrl serve-rollout` of that model in a process of its
own; the trainer's side publishes the weights --repeats times (serving/weights_push.py): "held" is how long
`publish` takes (the copy into flat buffers and the broadcast's start), "latency" until the server reports
the new version on /health; "file" saves the state dict with torch.save and loads it into a copy of the model
(one process; a shared-file-system handover would pay this at least). Medians after the first.

    python scripts/bench_scaleout.py --json scripts/results/bench_scaleout.json"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_report import emit

ROOT = Path(__file__).resolve().parents[1]


def recipe_overrides(args: argparse.Namespace, out: Path) -> list[str]:
    return [f"output_dir={out}", f"max_steps={args.steps}", f"optim.prompts_per_step={args.prompts}",
            f"warm_start.steps={args.warm_start_steps}", "eval.every=0", "save_every=0", "logging.report_to=[none]",
            "logging.progress=false", "logging.print_every=0", f"scoring.groups_per_call={args.groups_per_call}",
            "algorithm.rollout_correction=tis"]


def throughput(out: Path, args: argparse.Namespace) -> dict:
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][args.warmup:]
    seconds = sum(s["time_step_s"] for s in steps)
    rows = args.prompts * 8
    return {"steps": len(steps), "seconds": round(seconds, 2), "samples_per_s": rows * len(steps) / seconds,
            "generate_share": sum(s["time_generate_s"] for s in steps) / seconds,
            "staleness_mean": sum(s["rollout/staleness_mean"] for s in steps) / len(steps)}


def single_run(args: argparse.Namespace, folder: Path) -> dict:
    out = folder / "single"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mmrl", "train", "text_demo", *recipe_overrides(args, out)], check=True,
                   cwd=ROOT, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return {**throughput(out, args), "wall_s": round(time.perf_counter() - started, 1)}


def served_runs(args: argparse.Namespace, folder: Path) -> dict:
    from ray.cluster_utils import Cluster

    from mmrl.cli.ray_train import train_on_ray
    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES, load_plugins
    load_plugins()
    os.environ["OMP_NUM_THREADS"] = "1"  # every placed process on one torch thread (forwarded to each role)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4})
    for _ in range(2):
        cluster.add_node(num_cpus=4)
    report = {}
    try:
        for servers in args.servers:
            out = folder / f"served_{servers}"
            overrides = [*recipe_overrides(args, out), "policy.rollout_engine=hf_server", "placement.trainer=1",
                         f"placement.rollout={servers}", f"rollout.mode={args.mode}",
                         f"rollout.max_staleness={args.staleness}"]
            started = time.perf_counter()
            train_on_ray(load_recipe(RECIPES.get("text_demo"), overrides), "text_demo", overrides, cluster.address)
            report[f"served_{servers}"] = {**throughput(out, args), "rollout_servers": servers,
                                           "wall_s": round(time.perf_counter() - started, 1)}
    finally:
        cluster.shutdown()
        os.environ.pop("OMP_NUM_THREADS", None)
    return report


def health_version(url: str) -> int | None:
    with urllib.request.urlopen(url + "/health", timeout=10) as response:
        return json.loads(response.read())["version"]


def push_times(size: str, args: argparse.Namespace, folder: Path) -> dict:
    """The weights push to one served model of `size` (HIDDENxLAYERS), and the file handover beside it."""
    import copy

    import torch

    from mmrl.config.parse import load_recipe
    from mmrl.core.policy import build_policy
    from mmrl.registry import RECIPES, load_plugins
    from mmrl.serving.server_directory import ServerSlot
    from mmrl.serving.weights_push import WeightsPush
    load_plugins()
    hidden, layers = (int(x) for x in size.split("x"))
    overrides = [f"policy.tiny_args.hidden={hidden}", f"policy.tiny_args.layers={layers}", "policy.tiny_args.heads=4"]
    model = build_policy(load_recipe(RECIPES.get("text_demo"), overrides)).model
    announce = folder / f"push-{size}.json"
    server = subprocess.Popen([sys.executable, "-m", "mmrl", "serve-rollout", "text_demo", *overrides, "--port", "0",
                               "--announce", str(announce)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    push = None
    try:
        slot = ServerSlot("push", path=announce)
        url = slot.wait(600).url
        push = WeightsPush([slot], model, "127.0.0.1")
        held, latency = [], []
        for version in range(args.repeats):
            with torch.no_grad():
                next(model.parameters()).add_(1e-3)  # new weights each time
            started = time.perf_counter()
            push.publish(model, version)
            held.append(time.perf_counter() - started)
            while health_version(url) != version:
                time.sleep(0.001)
            latency.append(time.perf_counter() - started)
        copy_of = copy.deepcopy(model)
        handover = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            torch.save(model.state_dict(), folder / "weights.pt")
            copy_of.load_state_dict(torch.load(folder / "weights.pt"))
            handover.append(time.perf_counter() - started)
    finally:
        if push is not None:
            push.close()
        server.terminate()
        server.wait()
    params = sum(p.numel() for p in model.parameters())
    mb = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2 ** 20
    return {"parameters": params, "state_dict_mb": round(mb, 1),
            "push_held_ms": 1000 * statistics.median(held[1:]), "push_latency_ms": 1000 * statistics.median(latency[1:]),
            "file_handover_ms": 1000 * statistics.median(handover[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the times")
    parser.add_argument("--prompts", type=int, default=16, help="prompt groups per step (x 8 samples)")
    parser.add_argument("--groups-per-call", type=int, default=2, help="prompt groups per request to a server")
    parser.add_argument("--mode", default="async", choices=["sync", "one_step_off", "async"])
    parser.add_argument("--staleness", type=int, default=1, help="rollout.max_staleness (sync: ignored)")
    parser.add_argument("--warm-start-steps", type=int, default=30)
    parser.add_argument("--push-size", action="append", default=None, metavar="HIDDENxLAYERS",
                        help="a model size for the weights push (repeat; default 128x2, 512x4, 1024x8)")
    parser.add_argument("--repeats", type=int, default=6, help="weights pushes per size")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    if args.mode == "sync":
        args.staleness = 0
    sys.path.insert(0, str(ROOT))
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        runs = {"single": single_run(args, Path(folder)), **served_runs(args, Path(folder))}
        for run in runs.values():
            run["samples_per_s_vs_single"] = run["samples_per_s"] / runs["single"]["samples_per_s"]
        pushes = {size: push_times(size, args, Path(folder)) for size in args.push_size or ["128x2", "512x4", "1024x8"]}
    emit({"throughput": runs, "weights_push": pushes, "load_average": [load, os.getloadavg()[0]],
          "settings": {k: v for k, v in vars(args).items() if k != "json"}}, args.json)


if __name__ == "__main__":
    main()
