"""One GRPO step of mmrl against (a) the bare work and (b) TRL's GRPOTrainer, in one run.

Same tiny Qwen2, same prompts, G completions of exactly T tokens each (eos suppressed), beta 0,
one optimizer step per rollout batch, 2 CPU threads. Each contender runs in its own process
for `--steps` timed steps after `--warmup` untimed ones; median step times are compared. The
bare work is `generate` + a forward/backward of the same tokens with a plain log-softmax
policy-gradient loss + an AdamW step: the floor any GRPO trainer sits on.

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

from bench_harness import (
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
    trl_step_timer,
    worker,
)
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


class BareStep:
    """generate + forward/backward of the same tokens + AdamW step, on a model of its own."""

    def __init__(self, args):
        import torch
        from mmrl.tasks.demos.tiny_models import qwen2_char
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
        adv = group_advantages(tok.batch_decode(completion, skip_special_tokens=True), args.group)
        full_mask = torch.cat([mask, torch.ones_like(completion)], 1)
        logits = model(input_ids=seq, attention_mask=full_mask,
                       position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)).logits
        policy_gradient_update(self.opt, logits[:, ids.shape[1] - 1:-1], completion, adv)
        return time.perf_counter() - t0


def run_mmrl(args, bare: BareStep | None) -> tuple[list[float], list[float], list]:
    from mmrl.config.parse import parse_config
    from mmrl.train.trainer import Trainer
    recipe = mmrl_recipe(args, "causal_lm",
                         {"model": "tiny:qwen2-char", "tiny_args": model_args(args), "max_new_tokens": args.tokens,
                          "min_new_tokens": args.tokens, "temperature": 1.0, "prefix_sharing": "auto",
                          "shared_prefill": True},
                         {"path": _prompt_file(args)})
    trainer = Trainer(parse_config(recipe))
    times, floor, _ = timed_steps(trainer.train_step, args.warmup, args.steps, bare)
    return times, floor, []


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
    data = Dataset.from_list([{"prompt": p} for p in prompts(args)] * (args.warmup + args.steps + 1))
    trainer = GRPOTrainer(model=model, reward_funcs=digit_share, args=trl_grpo_config(args), train_dataset=data,
                          processing_class=tok, callbacks=[trl_step_timer(args.warmup, times, floor, bare)])
    trainer.train()
    return times, floor, []


def summary(args, rss: dict[str, float], per_step: dict[str, list], floor: dict[str, list]) -> dict:
    """The report: each trainer's step time over the bare steps beside it, mmrl's over TRL's where
    TRL ran, peak RSS where measured."""
    ratio = {name: over_bare(per_step[name], floor[name]) for name in per_step}
    trl = {}
    if args.trl:
        trl["trl_time_ratio"] = ratio["mmrl"] / ratio["trl"]
        if rss:
            trl["trl_peak_rss_ratio"] = rss["mmrl"] / rss["trl"]
        trl["trl_overhead_ratio"] = ratio["trl"]
    return {
        "overhead_ratio": ratio["mmrl"], **trl,
        "median_step_s": {name: statistics.median(v) for name, v in per_step.items()},
        "median_bare_step_s": {f"beside_{name}": statistics.median(v) for name, v in floor.items()},
        **({"peak_rss_mb": rss} if rss else {}),
        "setup": {"group": args.group, "prompts": args.prompts, "prompt_tokens": args.prompt_tokens,
                  "completion_tokens": args.tokens,
                  "threads": args.threads, "timed_steps": args.steps * args.rounds, "model": model_args(args)},
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
    parser.add_argument("--rounds", type=int, default=2, help="repeat the timing pass this many times")
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
    rss, per_step, floor, _ = compare(__file__, options, args.threads, args.rounds, *contenders(args))
    report = summary(args, rss, per_step, floor)
    emit(report, args.json)


if __name__ == "__main__":
    main()
