"""Shared by the trainer benchmarks (bench_engine, bench_vlm): each contender runs in a process of
its own, its steps alternating with bare steps on a second copy of the model, and its time is
taken relative to the bare steps beside it (process-to-process variation here is ~10%, larger
than the differences measured); each round starts fresh processes, and the reports give the
median and range over rounds and the machine's load average before and after. Peak RSS comes from
a contender alone in a fresh process. Also the pieces every contender shares: the reward, the bare
policy-gradient update, and the mmrl recipe and TRL config of one GRPO step with the same settings."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

CONTENDERS = ("bare", "mmrl", "trl")
BENCH_REWARD = "bench_digit_share"
STEP_PHASES = ("generate", "reward", "forward", "backward", "optimizer")  # mmrl's `time_<phase>_s`; the rest is other


def digit_share(prompts, completions, **kwargs) -> list[float]:
    """Share of digits in a completion (TRL passes conversational completions as messages)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


def group_advantages(texts: list[str], group: int):
    """The bare work's advantages: digit_share minus its group mean (no std scaling)."""
    import torch
    rewards = torch.tensor(digit_share(None, texts))
    return rewards - rewards.view(-1, group).mean(1).repeat_interleave(group)


def policy_gradient_update(opt, logits, completion, advantages, clock: list[float] | None = None,
                           step: bool = True) -> None:
    """The bare work's update: loss = -mean_{i,t} A_i log p(y_it) from the completion's logits
    [B, T, V] (fp32 log-softmax), backward, and (`step`) the optimizer step; the time after each of
    the three is appended to `clock` where given."""
    import torch
    logp = torch.log_softmax(logits.float(), -1).gather(-1, completion[..., None]).squeeze(-1)
    loss = -(advantages[:, None] * logp).mean()
    for work in (lambda: None, loss.backward, (lambda: (opt.step(), opt.zero_grad())) if step else (lambda: None)):
        work()
        if clock is not None:
            clock.append(time.perf_counter())


def mmrl_recipe(args, task: str, policy: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """One mmrl GRPO step per rollout batch of `args.prompts` x `args.group` completions, rewarded
    by digit_share (registered as BENCH_REWARD), beta 0, no clipping of the gradient norm. The
    benchmarks call `Trainer.train_step` alone, which neither logs nor plots (only `Trainer.train`
    does), so the logging settings are the defaults less TensorBoard and the progress bar."""
    from mmrl.core.scoring import REWARDS, register_reward
    if BENCH_REWARD not in REWARDS:
        register_reward(BENCH_REWARD)(digit_share)
    return {
        "task": task, "policy": policy, "data": data,
        "rewards": {BENCH_REWARD: {"weight": 1.0}},
        "algorithm": {"group_size": args.group, "estimator": "grpo", "beta": 0.0},
        "optim": {"lr": 1e-5, "prompts_per_step": args.prompts, "micro_batch_size": args.prompts * args.group,
                  "max_grad_norm": None},
        "logging": {"report_to": ["none"], "progress": False},
        "output_dir": tempfile.mkdtemp(prefix="mmrl-bench-"), "max_steps": args.warmup + args.steps,
        "save_every": 0,
    }


def trl_grpo_config(args):
    """TRL's GRPOConfig with the settings of `mmrl_recipe`: exactly `args.tokens` completion tokens,
    fp32 compute without activation checkpointing like the other contenders (GRPOConfig's own
    defaults are bf16=True, which autocasts the forward and backward to bfloat16 on a CPU too,
    and gradient_checkpointing=True)."""
    import torch
    from trl import GRPOConfig
    return GRPOConfig(bf16=False, gradient_checkpointing=False,
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group, max_completion_length=args.tokens,
        generation_kwargs={"min_new_tokens": args.tokens}, temperature=1.0, top_k=0, beta=0.0,
        learning_rate=1e-5, max_grad_norm=0.0, max_steps=args.warmup + args.steps, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=not torch.cuda.is_available(), shuffle_dataset=False,
        disable_dropout=True,
        lr_scheduler_type="constant", warmup_steps=0, dataloader_num_workers=0, seed=0)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class PhaseTimer:
    """Wall time spent in chosen methods, summed per phase until `take()`; a phase entered
    while another is running counts towards the outer one."""

    def __init__(self):
        self.total: dict[str, float] = defaultdict(float)
        self.active = False

    def wrap(self, obj: Any, method: str, phase: str) -> None:
        inner = getattr(obj, method)

        def timed(*args, **kwargs):
            if self.active:
                return inner(*args, **kwargs)
            self.active, t0 = True, time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.total[phase] += time.perf_counter() - t0
                self.active = False

        setattr(obj, method, timed)

    def take(self) -> dict[str, float]:
        out = dict(self.total)
        self.total.clear()
        return out


def trl_phases(trainer, phases: PhaseTimer) -> None:
    """Time TRL's GRPOTrainer in mmrl's step phases (STEP_PHASES) on `phases`: its sampling, reward
    functions, log-prob forward with the loss, backward, and optimizer step with clearing the gradients."""
    from accelerate.optimizer import AcceleratedOptimizer
    phases.wrap(trainer, "_generate_single_turn", "generate")
    phases.wrap(trainer, "_calculate_rewards", "reward")
    phases.wrap(trainer, "compute_loss", "forward")
    phases.wrap(trainer, "_get_per_token_logps_and_entropies", "forward")  # the old/reference passes, if any
    phases.wrap(trainer.accelerator, "backward", "backward")
    for method in ("step", "zero_grad"):  # the optimizer exists only once training starts: its class
        phases.wrap(AcceleratedOptimizer, method, "optimizer")


def with_other(step_s: float, phases: dict[str, float]) -> dict[str, float]:
    """`phases` of one step (STEP_PHASES, missing ones at 0) and `other`, the step's time outside them."""
    out = {p: phases.get(p, 0.0) for p in STEP_PHASES}
    out["other"] = step_s - sum(out.values())
    return out


def timed_steps(step: Callable[[], Any], warmup: int, steps: int,
                bare: Callable[[], float] | None) -> tuple[list[float], list[float], list[Any]]:
    """Run `warmup + steps` steps; for each timed one its wall time, the time of a bare step run
    right after it (when `bare` is given), and what `step` returned."""
    times, floor, results = [], [], []
    for k in range(warmup + steps):
        t0 = time.perf_counter()
        result = step()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
            results.append(result)
            if bare is not None:
                floor.append(bare())
    return times, floor, results


def trl_step_timer(warmup: int, times: list[float], floor: list[float], bare: Callable[[], float] | None,
                   phases: PhaseTimer | None = None, split: list[dict] | None = None):
    """A TRL `TrainerCallback` that appends the wall time from one step's end to the next
    (generation, scoring and update included, the interleaved bare step left out) to `times`,
    the bare step's time to `floor`, and the step's phases to `split`."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        last = None

        def on_step_end(self, a, state, control, **kw):
            now = time.perf_counter()
            step_phases = phases.take() if phases is not None else {}
            if state.global_step > warmup and self.last is not None:
                times.append(now - self.last)
                if split is not None:
                    split.append(step_phases)
                if bare is not None:
                    floor.append(bare())
            self.last = time.perf_counter()

    return StepTimer()


def worker(args, make_bare: Callable[[Any], Callable[[], float]],
           runners: dict[str, Callable[..., tuple[list[float], list[float], list[Any]]]]) -> dict:
    """One process: `--worker NAME` alone (peak RSS), or, with `--interleave`, NAME's steps
    alternating with bare steps on a model of its own (step-time ratio within one process).
    `runners[NAME](args, bare)` returns (step times, bare times beside them, per-step extras)."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.worker == "bare":
        bare = make_bare(args)
        times = [bare() for _ in range(args.warmup + args.steps)][args.warmup:]
        return {"times": times, "floor": [], "peak_rss_mb": peak_rss_mb()}
    bare = make_bare(args) if args.interleave else None
    times, floor, extra = runners[args.worker](args, bare)
    return {"times": times, "floor": floor, "extra": extra, "floor_extra": getattr(bare, "splits", []),
            "peak_rss_mb": peak_rss_mb()}


def add_contender_options(parser: argparse.ArgumentParser) -> None:
    """Which contenders run: TRL's trainer or not, and the peak-RSS pass or not."""
    parser.add_argument("--trl", action=argparse.BooleanOptionalAction, default=True,
                        help="time TRL's GRPOTrainer too (needs trl: pip install -e '.[bench]'); "
                             "--no-trl: mmrl and the bare work only, without the mmrl / TRL ratios")
    parser.add_argument("--rss", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure each contender's peak RSS alone in a fresh process")


def require_trl(wanted: bool) -> None:
    """Stop with a user error where TRL's contender is asked for and trl is not installed."""
    if wanted and importlib.util.find_spec("trl") is None:
        sys.exit("trl is not installed: pip install -e '.[bench]', or pass --no-trl to leave TRL's contender out")


def contenders(args) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the trainers timed against the bare work, the contenders whose peak RSS is measured alone)."""
    timed = ("mmrl", "trl") if args.trl else ("mmrl",)
    return timed, (("bare",) + timed if args.rss else ())


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """The hidden options `launch` gives a worker process."""
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--interleave", action="store_true", help=argparse.SUPPRESS)


def launch(script: str, name: str, options: dict[str, Any], interleave: bool, threads: int,
           flags: tuple[str, ...] = ()) -> dict:
    """`python script --worker NAME --key=value ... FLAGS` in a fresh process; its last stdout line, as JSON."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, script, "--worker", name] + [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    cmd += list(flags)
    if interleave:
        cmd.append("--interleave")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Comparison:
    """What `compare` measured: each contender's peak RSS alone; per round (fresh processes), per
    timed contender, its step times, the bare step times beside them and the per-step extras of
    both; the 1-, 5- and 15-minute load averages before and after."""

    rss: dict[str, float]
    rounds: list[dict[str, dict[str, list]]]
    load_average: dict[str, list[float]]

    def pooled(self, key: str) -> dict[str, list]:
        """`key` ("times", "floor", "extra" or "floor_extra") of every round, per contender."""
        return {name: [x for r in self.rounds for x in r[name][key]] for name in self.rounds[0]}

    def per_round(self, ratio: Callable[[dict[str, dict[str, list]]], float]) -> dict[str, Any]:
        """`ratio` of each round, with their median and range."""
        return spread([ratio(r) for r in self.rounds])


def spread(values: list[float]) -> dict[str, Any]:
    """The median, range and values of a figure measured once per round."""
    return {"median": statistics.median(values), "range": [min(values), max(values)], "runs": values}


def load_average() -> list[float]:
    """The machine's 1-, 5- and 15-minute load averages (an idle 2-core machine reads below 0.5)."""
    return [round(x, 2) for x in os.getloadavg()]


def compare(script: str, options: dict[str, Any], threads: int, rounds: int, timed: tuple[str, ...],
            alone: tuple[str, ...]) -> Comparison:
    """Peak RSS of each of `alone` in a fresh process; then `rounds` rounds in which each of `timed`
    runs interleaved with bare steps, in a fresh process."""
    before = load_average()
    rss = {name: launch(script, name, options, interleave=False, threads=threads)["peak_rss_mb"] for name in alone}
    measured = []
    for _ in range(rounds):
        row = {}
        for name in timed:
            out = launch(script, name, options, interleave=True, threads=threads)
            row[name] = {"times": out["times"], "floor": out["floor"], "extra": out.get("extra", []),
                         "floor_extra": out.get("floor_extra", [])}
        measured.append(row)
    return Comparison(rss, measured, {"before": before, "after": load_average()})


def over_bare(times: list[float], floor: list[float]) -> float:
    """Median step time over the median bare step beside it."""
    return statistics.median(times) / statistics.median(floor)
