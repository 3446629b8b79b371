"""Memory and step time of one GRPO step: 1 process against FSDP2 over 2 processes, in one run.

Two models: a causal LM of about 50M parameters (the tiny Qwen2 at hidden 512, 12 layers, by default) and the
tiny SD3 transformer, each trained in full (no LoRA) with a KL term, so the reference model is
counted too (a whole replica per process on 1 process, a frozen sharded copy under FSDP).

    python scripts/bench_sharding.py --json scripts/results/bench_sharding.json

Each configuration runs in fresh processes (`--worker`, under torchrun for FSDP, one CPU thread
per process, gloo), takes `--steps` training steps and reports the last. Memory is counted
from the tensors themselves, per process: parameters (policy and reference), gradients and
AdamW state, at the moment all three exist (just before the optimizer step), each sharded
tensor counted by its local shard. A forward additionally holds one gathered shard unit (a
decoder layer) under FSDP; rollouts under `distributed.rollout_params: gathered` hold one whole
copy of the policy in the compute dtype (`gathered_rollout_copy_mb`), under `sharded` only one
unit. Keys: `memory_ratio_lm`, `memory_ratio_diffusion` (FSDP over 2 / 1 process; the goal
is <= 0.6), `time_ratio_lm`, `time_ratio_diffusion` (step time, FSDP with gathered rollouts / 1
process; reported, no goal on CPU), and the same for `rollout_params: sharded`
(`time_ratio_*_sharded_rollouts`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_report import emit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECIPES = {
    "lm": {
        "task": "causal_lm",
        "policy": {"model": "tiny:qwen2-char", "tiny_args": {"heads": 8},  # + --lm-hidden / --lm-layers
                   "max_new_tokens": 16},
        "data": {"name": "arithmetic", "args": {"n_train": 64, "n_eval": 4, "digits": 2}},
        "rewards": {"accuracy": {"weight": 1.0}},
        "algorithm": {"group_size": 4, "beta": 0.04},
        "optim": {"lr": 1e-5, "prompts_per_step": 2, "micro_batch_size": 4},
    },
    "diffusion": {
        "task": "diffusion",
        "policy": {"model": "tiny:sd3", "tiny_args": {"layers": 4}, "height": 32, "width": 32, "num_steps": 4,
                   "eval_num_steps": 4, "noise_level": 0.7},
        "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 32}},
        "rewards": {"colour_shape": {"weight": 1.0}},
        "algorithm": {"group_size": 4, "beta": 0.04},
        "optim": {"lr": 1e-4, "prompts_per_step": 2, "micro_batch_size": 4},
    },
}


def sized(recipe: dict, args) -> dict:
    """`recipe` with the causal LM's width and depth from `--lm-hidden` / `--lm-layers`."""
    if recipe["task"] != "causal_lm":
        return recipe
    tiny = {**recipe["policy"]["tiny_args"], "hidden": args.lm_hidden, "layers": args.lm_layers}
    return {**recipe, "policy": {**recipe["policy"], "tiny_args": tiny}}


def tensor_bytes(tensors) -> int:
    from mmrl.distributed.fsdp_view import local_tensor
    seen, total = set(), 0
    for t in tensors:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        local = local_tensor(t)
        total += local.numel() * local.element_size()
    return total


def run_worker(args) -> None:
    """One configuration in this process (or this torchrun process group); rank 0 writes the JSON."""
    import torch

    from mmrl.cli.main import exit_without_teardown
    from mmrl.config.parse import parse_config
    from mmrl.train.loop.trainer import Trainer
    recipe = {**sized(RECIPES[args.worker], args), "logging": {"report_to": ["none"], "progress": False},
              "max_steps": args.steps, "output_dir": tempfile.mkdtemp(prefix="bench_sharding_")}
    overrides = [f"distributed.strategy={args.strategy}", f"distributed.rollout_params={args.rollout_params}"]
    trainer = Trainer(parse_config(recipe, overrides))
    model, reference, optimizer = trainer.model, trainer.reference, trainer.optimizer
    measured: dict[str, int] = {}
    step = optimizer.step

    def counting_step(*a, **k):  # parameters, gradients and AdamW state all exist here
        params = list(model.parameters()) + (list(reference.parameters()) if reference is not None else [])
        state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
        counts = {"parameters": tensor_bytes(params), "gradients": tensor_bytes(p.grad for p in model.parameters()),
                  "optimizer_state": tensor_bytes(state)}
        if optimizer.state:  # from the second step on (AdamW creates its state in the first)
            for key, value in counts.items():
                measured[key] = max(measured.get(key, 0), value)
        return step(*a, **k)

    optimizer.step = counting_step
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - start)
    policy_params = sum(p.numel() for p in model.parameters())  # a sharded parameter's numel is the whole one
    whole_copy = policy_params * 4  # fp32 compute here
    if trainer.accelerator.is_main_process:
        Path(args.out).write_text(json.dumps({
            "step_s": times[-1], "bytes": measured, "total_mb": sum(measured.values()) / 2**20,
            "policy_parameters": policy_params, "whole_copy_mb": whole_copy / 2**20}))
    exit_without_teardown(0)  # the interpreter's teardown of FSDP's gloo group can abort a finished process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(case: str, processes: int, strategy: str, rollout_params: str, args) -> dict:
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        launcher = [sys.executable]
        if processes > 1:
            launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_addr",
                         "127.0.0.1", "--master_port", str(free_port())]
        cmd = launcher + [str(Path(__file__).resolve()), "--worker", case, "--strategy", strategy,
                          "--rollout-params", rollout_params, "--steps", str(args.steps), "--out", str(out),
                          "--lm-hidden", str(args.lm_hidden), "--lm-layers", str(args.lm_layers)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{case} {strategy} x{processes} failed:\n{done.stderr[-4000:]}")
        return json.loads(out.read_text())


def case_report(case: str, args) -> dict:
    """One model's figures: 1 process against FSDP over 2 with gathered rollouts, and with sharded
    ones unless --no-sharded-rollouts."""
    one = measure(case, 1, "ddp", "gathered", args)
    fsdp = measure(case, 2, "fsdp", "gathered", args)
    steps = {"one_process": one["step_s"], "fsdp_gathered": fsdp["step_s"]}
    report = {f"memory_ratio_{case}": fsdp["total_mb"] / one["total_mb"],
              f"time_ratio_{case}": fsdp["step_s"] / one["step_s"]}
    if args.sharded_rollouts:
        steps["fsdp_sharded"] = measure(case, 2, "fsdp", "sharded", args)["step_s"]
        report[f"time_ratio_{case}_sharded_rollouts"] = steps["fsdp_sharded"] / one["step_s"]
    return {**report, f"{case}_parameters_m": one["policy_parameters"] / 1e6,
            f"{case}_one_process_mb": {k: v / 2**20 for k, v in one["bytes"].items()},
            f"{case}_fsdp_per_process_mb": {k: v / 2**20 for k, v in fsdp["bytes"].items()},
            f"{case}_gathered_rollout_copy_mb": one["whole_copy_mb"], f"{case}_step_s": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--steps", type=int, default=2,
                        help="training steps per run, at least 2 (the last is timed; memory is counted from the "
                             "second on, when AdamW's state exists)")
    parser.add_argument("--cases", nargs="+", choices=sorted(RECIPES), default=list(RECIPES),
                        help="the models measured")
    parser.add_argument("--lm-hidden", type=int, default=512, help="the causal LM's width")
    parser.add_argument("--lm-layers", type=int, default=12, help="the causal LM's depth")
    parser.add_argument("--sharded-rollouts", action=argparse.BooleanOptionalAction, default=True,
                        help="also time FSDP with distributed.rollout_params=sharded (a third run per model)")
    parser.add_argument("--worker", choices=sorted(RECIPES), help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--rollout-params", default="gathered", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: at least 2 (memory is counted from the second step on)")
    if args.worker:
        run_worker(args)
        return
    report: dict = {"processes": 2, "threads_per_process": 1, "device": "cpu (gloo)"}
    for case in args.cases:
        report.update(case_report(case, args))
    emit(report, args.json)


if __name__ == "__main__":
    main()
