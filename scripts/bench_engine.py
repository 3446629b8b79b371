"""One GRPO step of mmrl against (a) the bare work and (b) TRL's GRPOTrainer, in one run.

Same tiny Qwen2, same prompts, G completions of exactly T tokens each (eos suppressed), beta 0,
one optimizer step per rollout batch, fp32 compute, 2 CPU threads. Each contender runs in its own
process for `--steps` timed steps after `--warmup` untimed ones; median step times are compared.
The bare work is `generate` + a forward of the same tokens with logits for the completion
positions only (as TRL computes them) + a plain log-softmax policy-gradient loss, backward, and an
AdamW step: the floor any GRPO trainer sits on.

    python scripts/bench_engine.py --json bench_engine.json

prints and writes {"overhead_ratio": mmrl / bare, "trl_time_ratio": mmrl / TRL,
"trl_peak_rss_ratio": mmrl / TRL, "runs": {...}, "phase_ms": {...}, "load_average": {...}, ...}.
Step times are compared within a process: each trainer's steps alternate with bare steps on a
second copy of the model, and each trainer's time is taken relative to the bare steps beside it
(harness in `bench_harness.py`). The headline ratios are the medians over `--rounds` rounds of
fresh processes; "runs" has each round's and their range. "phase_ms" splits each contender's
median step into generate, reward, forward (log-probs and loss), backward, optimizer and other
(mmrl's from its own `time_*_s` metrics, TRL's from timers on its methods, the bare work's from
its own clock). Peak RSS comes from each contender alone in a fresh process. TRL is needed only
here (`pip install -e ".[bench]"`).

The memory case (`--memory`): each contender alone in a fresh process runs `--warmup` steps, then
one step under the allocation probe (scripts/memory_probe.py: on a GPU torch.cuda.max_memory_allocated,
on a CPU the profiler's allocation events): the most bytes allocated at once during the step above
what was allocated at its start (the weights and AdamW state, the same for all three), and each
contender's phases (rollout, the no-grad log-prob passes, the update, the optimizer). With
`--rounds 0` the steps are not timed. The large-vocabulary case of docs/benchmarks.md:

    python scripts/bench_engine.py --vocab 151936 --completion-tokens 512 --memory --rounds 0 --no-rss \
        --bare-micro-batch 1 --hidden 64 --layers 2 --warmup 1 --json bench_engine_memory.json

prints {"memory": {"peak_mb": {"mmrl", "trl", "bare"}, "trl_peak_ratio": mmrl / TRL, ...}}. The bare
loop's update runs `--bare-micro-batch` rows per forward and backward there (its whole fp32 logits
of 16 x 513 x 151936 and their log-softmax would be 10 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import tempfile
import time

from bench_harness import (
    STEP_PHASES,
    Comparison,
    PhaseTimer,
    add_contender_options,
    add_worker_options,
    compare,
    contenders,
    digit_share,
    group_advantages,
    launch,
    mmrl_recipe,
    over_bare,
    policy_gradient_update,
    require_trl,
    timed_steps,
    trl_grpo_config,
    trl_phases,
    trl_step_timer,
    with_other,
    worker,
)
from bench_report import emit
from memory_probe import MemoryProbe

PROMPTS = ["12+34=", "5+67=", "90+1=", "33+44="]
MODEL = {"hidden": 256, "layers": 4, "heads": 4, "seed": 0}


def model_args(args) -> dict:
    """The tiny Qwen2's size: MODEL, or `--hidden` / `--layers` where given, with positions for the
    longest prompt and its completion (a prompt that leaves no room for the completion is refused),
    and an output layer of `--vocab` tokens where given (the character tokenizer's otherwise)."""
    return {**MODEL, "hidden": args.hidden or MODEL["hidden"], "layers": args.layers or MODEL["layers"],
            "max_positions": max(512, max(args.prompt_tokens, *map(len, PROMPTS)) + args.tokens),
            **({"vocab": args.vocab} if args.vocab else {})}


def prompts(args) -> list[str]:
    """The step's prompts; with `--prompt-tokens N`, each led by seeded random digits and spaces
    to N characters (N tokens of the character tokenizer)."""
    rng = random.Random(0)
    return ["".join(rng.choice(string.digits + " ") for _ in range(args.prompt_tokens - len(p))) + p
            for p in PROMPTS[: args.prompts]]


class BareStep:
    """generate + forward/backward of the same tokens + AdamW step, on a model of its own; each
    call's phases (STEP_PHASES and other) are appended to `splits`. The update runs
    `--bare-micro-batch` rows per forward and backward (0: all at once)."""

    def __init__(self, args):
        import torch
        from mmrl.tasks.demos.tiny_models import qwen2_char
        self.args = args
        self.model, self.tok = qwen2_char(**model_args(args))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5, fused=True)
        enc = self.tok(prompts(args), padding=True, return_tensors="pt")
        self.ids = enc.input_ids.repeat_interleave(args.group, 0)
        self.mask = enc.attention_mask.repeat_interleave(args.group, 0)
        self.splits: list[dict[str, float]] = []

    def __call__(self) -> float:
        clock = [time.perf_counter()]
        seq = self.generate()
        clock.append(time.perf_counter())
        completion = seq[:, self.ids.shape[1]:]
        adv = group_advantages(self.tok.batch_decode(completion, skip_special_tokens=True), self.args.group)
        clock.append(time.perf_counter())
        self.update(seq, adv, clock)
        self.splits.append(dict(zip((*STEP_PHASES, "other"), [b - a for a, b in zip(clock, clock[1:])] + [0.0])))
        return clock[-1] - clock[0]

    def generate(self):
        """The sequences [N, prompt + T]: transformers' sampling under no_grad."""
        import torch
        args, tok = self.args, self.tok
        with torch.no_grad():
            return self.model.generate(input_ids=self.ids, attention_mask=self.mask, do_sample=True, temperature=1.0,
                                       top_k=0, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                                       pad_token_id=tok.pad_token_id)

    def update(self, seq, adv, clock: list[float]) -> None:
        """Forward (logits of the completion positions only), the policy-gradient loss, backward,
        AdamW; `--bare-micro-batch` rows at a time, the gradients summed over them."""
        import torch
        completion = seq[:, self.ids.shape[1]:]
        full_mask = torch.cat([self.mask, torch.ones_like(completion)], 1)
        rows = self.args.bare_micro_batch or len(seq)
        parts = range(0, len(seq), rows)
        for k, start in enumerate(parts):
            part = slice(start, start + rows)
            logits = self.model(input_ids=seq[part], attention_mask=full_mask[part],
                                position_ids=(full_mask[part].cumsum(-1) - 1).clamp(min=0),
                                logits_to_keep=completion.shape[1] + 1).logits
            scale = (min(start + rows, len(seq)) - start) / len(seq)  # the whole batch's mean
            policy_gradient_update(self.opt, logits[:, :-1], completion[part], adv[part] * scale,
                                   clock if k == len(parts) - 1 else None, step=k == len(parts) - 1)
            logits = None


def run_mmrl(args, bare: BareStep | None) -> tuple[list[float], list[float], list]:
    """mmrl's steps; their extras are the phases mmrl logs (`time_<phase>_s`)."""
    trainer = mmrl_trainer(args)
    times, floor, metrics = timed_steps(trainer.train_step, args.warmup, args.steps, bare)
    return times, floor, [{p: m[f"time_{p}_s"] for p in (*STEP_PHASES, "other")} for m in metrics]


def _prompt_file(args) -> str:
    path = os.path.join(tempfile.mkdtemp(prefix="mmrl-bench-data-"), "prompts.jsonl")
    with open(path, "w") as f:
        for p in prompts(args):
            f.write(json.dumps({"prompt": p}) + "\n")
    return path


def run_trl(args, bare: BareStep | None) -> tuple[list[float], list[float], list]:
    from datasets import Dataset
    from mmrl.tasks.demos.tiny_models import qwen2_char
    from trl import GRPOTrainer
    model, tok = qwen2_char(**model_args(args))
    times: list[float] = []
    floor: list[float] = []
    split: list[dict] = []
    data = Dataset.from_list([{"prompt": p} for p in prompts(args)] * (args.warmup + args.steps + 1))
    phases = PhaseTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=digit_share, args=trl_grpo_config(args), train_dataset=data,
                          processing_class=tok, callbacks=[trl_step_timer(args.warmup, times, floor, bare, phases, split)])
    trl_phases(trainer, phases)
    trainer.train()
    return times, floor, [with_other(t, p) for t, p in zip(times, split)]


# ----- the memory case: one step of each contender under the allocation probe --------------------
def mmrl_trainer(args):
    """mmrl's trainer of the benchmark's recipe."""
    from mmrl.config.parse import parse_config
    from mmrl.train.loop.trainer import Trainer
    return Trainer(parse_config(mmrl_recipe(args, "causal_lm",
                                            {"model": "tiny:qwen2-char", "tiny_args": model_args(args),
                                             "max_new_tokens": args.tokens, "min_new_tokens": args.tokens,
                                             "temperature": 1.0, "prefix_sharing": "auto", "shared_prefill": True},
                                            {"path": _prompt_file(args)})))


def probe_mmrl(args, probe: MemoryProbe) -> None:
    """`--warmup` steps, then one under the probe; phases: the rollout, the no-grad log-prob passes
    (old and reference, where the recipe takes them), the update passes, the optimizer step."""
    trainer = mmrl_trainer(args)
    for _ in range(args.warmup):
        trainer.train_step()
    probe.phase(trainer.policy, "rollout", "rollout")
    probe.phase(trainer.updater, "_old_and_reference", "no_grad_logprobs")
    probe.phase(trainer.updater, "accumulate_gradients", "update")
    probe.phase(trainer.strategy, "step", "optimizer")
    probe.start()
    trainer.train_step()
    probe.stop()


def probe_trl(args, probe: MemoryProbe) -> None:
    """TRL's GRPOTrainer: the step after `--warmup` ones under the probe (its callbacks start and stop
    it); phases: its generation, its loss (the log-prob forward), its backward, the optimizer step."""
    from accelerate.optimizer import AcceleratedOptimizer
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from mmrl.tasks.demos.tiny_models import qwen2_char

    class OneStep(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if state.global_step == args.warmup:
                probe.start()

        def on_step_end(self, a, state, control, **kw):
            if state.global_step == args.warmup + 1:
                probe.stop()

    model, tok = qwen2_char(**model_args(args))
    data = Dataset.from_list([{"prompt": p} for p in prompts(args)] * (args.warmup + 2))
    config = trl_grpo_config(args)
    config.max_steps = args.warmup + 1
    trainer = GRPOTrainer(model=model, reward_funcs=digit_share, args=config, train_dataset=data,
                          processing_class=tok, callbacks=[OneStep()])
    probe.phase(trainer, "_generate_single_turn", "rollout")
    probe.phase(trainer, "compute_loss", "update_forward")
    probe.phase(trainer.accelerator, "backward", "update_backward")
    probe.phase(AcceleratedOptimizer, "step", "optimizer")
    trainer.train()


def probe_bare(args, probe: MemoryProbe) -> None:
    """The bare loop: `--warmup` steps, then one under the probe; phases: generate, update."""
    bare = BareStep(args)
    for _ in range(args.warmup):
        bare()
    probe.phase(bare, "generate", "rollout")
    probe.phase(bare, "update", "update")
    probe.start()
    bare()
    probe.stop()


def memory_worker(args) -> dict:
    """One contender's probed step, in this process."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    probe = MemoryProbe()
    {"mmrl": probe_mmrl, "trl": probe_trl, "bare": probe_bare}[args.worker](args, probe)
    return probe.report()


def memory_report(args, options: dict) -> dict:
    """Each contender's probed step in a fresh process: its peak above the step's start, its phases,
    and mmrl's peak over TRL's and over the bare loop's."""
    import torch
    names = ("bare", "mmrl", "trl") if args.trl else ("bare", "mmrl")
    runs = {name: launch(__file__, name, options, interleave=False, threads=args.threads, flags=("--memory",))
            for name in names}
    peak = {name: run["peak_mb"] for name, run in runs.items()}
    return {"peak_mb": peak, **({"trl_peak_ratio": round(peak["mmrl"] / peak["trl"], 4)} if args.trl else {}),
            "bare_peak_ratio": round(peak["mmrl"] / peak["bare"], 4),
            "phases": {name: run["phases"] for name, run in runs.items()},
            "measure": ("torch.cuda.max_memory_allocated" if torch.cuda.is_available()
                        else "the CPU allocation probe (profiler allocation events)") + ", above the step's start",
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}


def phase_ms(per_step: dict[str, list[float]], extras: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Each contender's median step split into its phases' medians (ms); `other` is what is left of
    the median step, so the phases add up to it."""
    out = {}
    for name, rows in extras.items():
        phases = {p: 1e3 * statistics.median(r[p] for r in rows) for p in STEP_PHASES}
        phases["other"] = 1e3 * statistics.median(per_step[name]) - sum(phases.values())
        out[name] = {p: round(v, 2) for p, v in phases.items()}
    return out


def summary(args, measured: Comparison) -> dict:
    """The report: each trainer's step time over the bare steps beside it (the median over rounds,
    and each round's), mmrl's over TRL's where TRL ran, peak RSS where measured, the phases."""
    per_step, floor = measured.pooled("times"), measured.pooled("floor")
    ratio = lambda name: lambda r: over_bare(r[name]["times"], r[name]["floor"])  # noqa: E731 (one round's)
    runs = {"overhead_ratio": measured.per_round(ratio("mmrl"))}
    if args.trl:
        runs["trl_time_ratio"] = measured.per_round(lambda r: ratio("mmrl")(r) / ratio("trl")(r))
        runs["trl_overhead_ratio"] = measured.per_round(ratio("trl"))
    extras = {**measured.pooled("extra"), "bare": measured.pooled("floor_extra")["mmrl"]}
    rss = measured.rss
    return {
        **{name: v["median"] for name, v in runs.items()},
        **({"trl_peak_rss_ratio": rss["mmrl"] / rss["trl"]} if args.trl and rss else {}),
        "runs": runs, "phase_ms": phase_ms({**per_step, "bare": floor["mmrl"]}, extras),
        "median_step_s": {name: statistics.median(v) for name, v in per_step.items()},
        "median_bare_step_s": {f"beside_{name}": statistics.median(v) for name, v in floor.items()},
        **({"peak_rss_mb": rss} if rss else {}), "load_average": measured.load_average,
        "setup": {"group": args.group, "prompts": args.prompts, "prompt_tokens": args.prompt_tokens,
                  "completion_tokens": args.tokens, "threads": args.threads, "rounds": args.rounds,
                  "timed_steps": args.steps * args.rounds, "model": model_args(args)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the result here too")
    parser.add_argument("--steps", type=int, default=12, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step (at most 4)")
    parser.add_argument("--completion-tokens", "--tokens", dest="tokens", type=int, default=32,
                        help="tokens per completion (T)")
    parser.add_argument("--vocab", type=int, default=0,
                        help="the output layer's tokens (0: the character tokenizer's; the large case: 151936)")
    parser.add_argument("--memory", action="store_true",
                        help="also probe one step of each contender for its peak allocated memory (module docstring)")
    parser.add_argument("--bare-micro-batch", type=int, default=0,
                        help="rows per forward and backward of the bare loop's update (0: all at once)")
    parser.add_argument("--prompt-tokens", type=int, default=0,
                        help="lengthen each prompt to this many tokens (bench_prefix: 512)")
    parser.add_argument("--hidden", type=int, default=0, help="model width (default: MODEL's)")
    parser.add_argument("--layers", type=int, default=0, help="model depth (default: MODEL's)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each process")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of fresh processes (the report gives the median and range over them)")
    add_contender_options(parser)
    add_worker_options(parser)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(memory_worker(args) if args.memory
                         else worker(args, BareStep, {"mmrl": run_mmrl, "trl": run_trl})))
        return

    # memory: each contender alone in a fresh process; time: each trainer's steps alternate with
    # bare steps in the same process, so machine drift and per-process variation cancel in the
    # ratio; rounds alternate the two trainers
    require_trl(args.trl)
    options = {k: getattr(args, k) for k in ("steps", "warmup", "group", "prompts", "tokens", "prompt_tokens",
                                             "hidden", "layers", "threads", "vocab", "bare_micro_batch")}
    report = {}
    if args.rounds > 0:
        report = summary(args, compare(__file__, options, args.threads, args.rounds, *contenders(args)))
    if args.memory:
        report["memory"] = memory_report(args, options)
        report.setdefault("setup", {"group": args.group, "prompts": args.prompts, "completion_tokens": args.tokens,
                                    "threads": args.threads, "model": model_args(args)})
    emit(report, args.json)


if __name__ == "__main__":
    main()
