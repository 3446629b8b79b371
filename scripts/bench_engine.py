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

PROMPTS = ["12+34=", "5+67=", "90+1=", "33+44="]
MODEL = {"hidden": 256, "layers": 4, "heads": 4, "seed": 0}


def model_args(args) -> dict:
    """The tiny Qwen2's size: MODEL, or `--hidden` / `--layers` where given, with positions for the
    longest prompt and its completion (a prompt that leaves no room for the completion is refused)."""
    return {**MODEL, "hidden": args.hidden or MODEL["hidden"], "layers": args.layers or MODEL["layers"],
            "max_positions": max(512, args.prompt_tokens + args.tokens)}


def prompts(args) -> list[str]:
    """The step's prompts; with `--prompt-tokens N`, each led by seeded random digits and spaces
    to N characters (N tokens of the character tokenizer)."""
    rng = random.Random(0)
    return ["".join(rng.choice(string.digits + " ") for _ in range(args.prompt_tokens - len(p))) + p
            for p in PROMPTS[: args.prompts]]


class BareStep:
    """generate + forward/backward of the same tokens + AdamW step, on a model of its own; each
    call's phases (STEP_PHASES and other) are appended to `splits`."""

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
        import torch
        args, model, tok, ids, mask = self.args, self.model, self.tok, self.ids, self.mask
        clock = [time.perf_counter()]
        with torch.no_grad():
            seq = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                 top_k=0, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                                 pad_token_id=tok.pad_token_id)
        clock.append(time.perf_counter())
        completion = seq[:, ids.shape[1]:]
        adv = group_advantages(tok.batch_decode(completion, skip_special_tokens=True), args.group)
        clock.append(time.perf_counter())
        full_mask = torch.cat([mask, torch.ones_like(completion)], 1)
        logits = model(input_ids=seq, attention_mask=full_mask, position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0),
                       logits_to_keep=completion.shape[1] + 1).logits
        policy_gradient_update(self.opt, logits[:, :-1], completion, adv, clock)
        self.splits.append(dict(zip((*STEP_PHASES, "other"), [b - a for a, b in zip(clock, clock[1:])] + [0.0])))
        return clock[-1] - clock[0]


def run_mmrl(args, bare: BareStep | None) -> tuple[list[float], list[float], list]:
    """mmrl's steps; their extras are the phases mmrl logs (`time_<phase>_s`)."""
    from mmrl.config.parse import parse_config
    from mmrl.train.loop.trainer import Trainer
    recipe = mmrl_recipe(args, "causal_lm",
                         {"model": "tiny:qwen2-char", "tiny_args": model_args(args), "max_new_tokens": args.tokens,
                          "min_new_tokens": args.tokens, "temperature": 1.0, "prefix_sharing": "auto",
                          "shared_prefill": True},
                         {"path": _prompt_file(args)})
    trainer = Trainer(parse_config(recipe))
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
    parser.add_argument("--tokens", type=int, default=32, help="tokens per completion (T)")
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
        print(json.dumps(worker(args, BareStep, {"mmrl": run_mmrl, "trl": run_trl})))
        return

    # memory: each contender alone in a fresh process; time: each trainer's steps alternate with
    # bare steps in the same process, so machine drift and per-process variation cancel in the
    # ratio; rounds alternate the two trainers
    require_trl(args.trl)
    options = {k: getattr(args, k) for k in ("steps", "warmup", "group", "prompts", "tokens", "prompt_tokens",
                                             "hidden", "layers", "threads")}
    emit(summary(args, compare(__file__, options, args.threads, args.rounds, *contenders(args))), args.json)


if __name__ == "__main__":
    main()
