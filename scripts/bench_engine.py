"""One GRPO step of mmrl against (a) the bare work and (b) TRL's GRPOTrainer, in one run.

Same tiny Qwen2, same prompts, G completions of exactly T tokens each (eos suppressed), beta 0,
one optimizer step per rollout batch, 2 CPU threads. Each contender runs in its own process
for `--steps` timed steps after `--warmup` untimed ones; median step times are compared. The bare work is `generate` + a forward/backward of the same tokens with
a plain log-softmax policy-gradient loss + an AdamW step: the floor any GRPO trainer sits on.

    python scripts/bench_engine.py --json bench_engine.json

prints and writes {"overhead_ratio": mmrl / bare, "trl_time_ratio": mmrl / TRL,
"trl_peak_rss_ratio": mmrl / TRL, ...}. Step times are compared within a process: each trainer's
steps alternate with bare steps on a second copy of the model, and each trainer's time is taken
relative to the bare steps beside it (harness in `bench_harness.py`). Peak RSS comes from each
contender alone in a fresh process. TRL is needed only here (`pip install -e ".[bench]"`).
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

from bench_harness import compare, over_bare, peak_rss_mb, timed_steps, trl_step_timer
from bench_report import emit

PROMPTS = ["12+34=", "5+67=", "90+1=", "33+44="]
MODEL = {"hidden": 256, "layers": 4, "heads": 4, "seed": 0}


def model_args(args) -> dict:
    """The tiny Qwen2's size: MODEL, or `--hidden` / `--layers` where given."""
    return {**MODEL, "hidden": args.hidden or MODEL["hidden"], "layers": args.layers or MODEL["layers"]}


def prompts(args) -> list[str]:
    """The step's prompts; with `--prompt-tokens N`, each led by seeded random digits and spaces
    to N characters (N tokens of the character tokenizer)."""
    rng = random.Random(0)
    return ["".join(rng.choice(string.digits + " ") for _ in range(args.prompt_tokens - len(p))) + p
            for p in PROMPTS[: args.prompts]]


def digit_share(prompts, completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


class BareStep:
    """generate + forward/backward of the same tokens + AdamW step, on a model of its own."""

    def __init__(self, args):
        import torch
        from tasks.tiny_models import qwen2_char
        self.args = args
        self.model, self.tok = qwen2_char(**model_args(args))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5, fused=True)
        enc = self.tok(prompts(args), padding=True, return_tensors="pt")
        self.ids = enc.input_ids.repeat_interleave(args.group, 0)
        self.mask = enc.attention_mask.repeat_interleave(args.group, 0)

    def __call__(self) -> float:
        import torch
        args, model, tok, ids, mask = self.args, self.model, self.tok, self.ids, self.mask
        t0 = time.perf_counter()
        with torch.no_grad():
            seq = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                 top_k=0, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                                 pad_token_id=tok.pad_token_id)
        completion = seq[:, ids.shape[1]:]
        rewards = torch.tensor(digit_share(None, tok.batch_decode(completion, skip_special_tokens=True)))
        adv = rewards - rewards.view(-1, args.group).mean(1).repeat_interleave(args.group)
        full_mask = torch.cat([mask, torch.ones_like(completion)], 1)
        logits = model(input_ids=seq, attention_mask=full_mask,
                       position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)).logits
        logp = torch.log_softmax(logits[:, ids.shape[1] - 1:-1].float(), -1)
        logp = logp.gather(-1, completion[..., None]).squeeze(-1)
        (-(adv[:, None] * logp).mean()).backward()
        self.opt.step()
        self.opt.zero_grad()
        return time.perf_counter() - t0


def run_bare(args, bare: BareStep) -> list[float]:
    return [bare() for _ in range(args.warmup + args.steps)][args.warmup:]


def run_mmrl(args, bare: BareStep | None) -> tuple[list[float], list[float]]:
    from mmrl.config import parse_config
    from mmrl.reward_registry import REWARDS, register_reward
    from mmrl.trainer import Trainer
    if "bench_digit_share" not in REWARDS:
        register_reward("bench_digit_share")(digit_share)
    out = tempfile.mkdtemp(prefix="mmrl-bench-")
    recipe = {
        "task": "causal_lm",
        "policy": {"model": "tiny:qwen2-char", "tiny_args": model_args(args), "max_new_tokens": args.tokens,
                   "min_new_tokens": args.tokens, "temperature": 1.0, "prefix_sharing": "auto",
                   "shared_prefill": True},
        "data": {"path": _prompt_file(args)},
        "rewards": {"bench_digit_share": {"weight": 1.0}},
        "algorithm": {"group_size": args.group, "estimator": "grpo", "beta": 0.0},
        "optim": {"lr": 1e-5, "prompts_per_step": args.prompts, "micro_batch_size": args.prompts * args.group,
                  "max_grad_norm": None},
        "logging": {"report_to": ["none"], "progress": False, "plot_every": 0},
        "output_dir": out, "max_steps": args.warmup + args.steps, "save_every": 0,
    }
    trainer = Trainer(parse_config(recipe))
    times, floor, _ = timed_steps(trainer.train_step, args.warmup, args.steps, bare)
    return times, floor


def _prompt_file(args) -> str:
    path = os.path.join(tempfile.mkdtemp(prefix="mmrl-bench-data-"), "prompts.jsonl")
    with open(path, "w") as f:
        for p in prompts(args):
            f.write(json.dumps({"prompt": p}) + "\n")
    return path


def run_trl(args, bare: BareStep | None) -> tuple[list[float], list[float]]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from tasks.tiny_models import qwen2_char
    model, tok = qwen2_char(**model_args(args))
    times: list[float] = []
    floor: list[float] = []
    data = Dataset.from_list([{"prompt": p} for p in prompts(args)] * (args.warmup + args.steps + 1))
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group, max_completion_length=args.tokens,
        generation_kwargs={"min_new_tokens": args.tokens}, temperature=1.0, top_k=0, beta=0.0,
        learning_rate=1e-5, max_grad_norm=0.0, max_steps=args.warmup + args.steps, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, shuffle_dataset=False, disable_dropout=True,
        lr_scheduler_type="constant", warmup_steps=0, dataloader_num_workers=0, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=digit_share, args=config, train_dataset=data,
                          processing_class=tok, callbacks=[trl_step_timer(args.warmup, times, floor, bare)])
    trainer.train()
    return times, floor


CONTENDERS = ("bare", "mmrl", "trl")


def worker(args) -> dict:
    """One process: `--worker NAME` alone (peak RSS), or, with `--interleave`, NAME's steps
    alternating with bare steps on a model of its own (step-time ratio within one process)."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.worker == "bare":
        bare = BareStep(args)
        return {"times": run_bare(args, bare), "floor": [], "peak_rss_mb": peak_rss_mb()}
    bare = BareStep(args) if args.interleave else None
    times, floor = {"mmrl": run_mmrl, "trl": run_trl}[args.worker](args, bare)
    return {"times": times, "floor": floor, "peak_rss_mb": peak_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the result here too")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=0,
                        help="lengthen each prompt to this many tokens (bench_prefix: 512)")
    parser.add_argument("--hidden", type=int, default=0, help="model width (default: MODEL's)")
    parser.add_argument("--layers", type=int, default=0, help="model depth (default: MODEL's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="repeat the timing pass this many times")
    parser.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--interleave", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    # memory: each contender alone in a fresh process; time: each trainer's steps alternate with
    # bare steps in the same process, so machine drift and per-process variation cancel in the
    # ratio; rounds alternate the two trainers
    options = {k: getattr(args, k) for k in ("steps", "warmup", "group", "prompts", "tokens", "prompt_tokens",
                                             "hidden", "layers", "threads")}
    rss, per_step, floor, _ = compare(__file__, options, args.threads, args.rounds, ("mmrl", "trl"), CONTENDERS)
    ratio = {name: over_bare(per_step[name], floor[name]) for name in per_step}
    report = {
        "overhead_ratio": ratio["mmrl"],
        "trl_time_ratio": ratio["mmrl"] / ratio["trl"],
        "trl_peak_rss_ratio": rss["mmrl"] / rss["trl"],
        "trl_overhead_ratio": ratio["trl"],
        "median_step_s": {name: statistics.median(v) for name, v in per_step.items()},
        "median_bare_step_s": {f"beside_{name}": statistics.median(v) for name, v in floor.items()},
        "peak_rss_mb": rss,
        "setup": {"group": args.group, "prompts": args.prompts, "prompt_tokens": args.prompt_tokens,
                  "completion_tokens": args.tokens,
                  "threads": args.threads, "timed_steps": args.steps * args.rounds, "model": model_args(args)},
    }
    emit(report, args.json)


if __name__ == "__main__":
    main()
