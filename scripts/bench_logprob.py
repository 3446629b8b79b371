"""Log-probs from hidden states (the logits never whole) against today's chunked log-softmax of
the model's logits: the operator alone, then a whole GRPO step beside TRL's GRPOTrainer.

1. The log-prob pass of a Qwen-sized output layer (hidden sizes `--hidden`, vocabulary `--vocab`,
   `--tokens` tokens): forward and backward of loss = sum_t g_t log p(y_t), through
   `hidden_state_logprobs` (fused, `--chunk` tokens at a time) and through the model head's
   whole logits then `selective_log_softmax` (today's path). For each size: the peak memory each
   allocates above its inputs (CUDA's allocator, or on a CPU the profiler's allocation events),
   `peak_memory_ratio` fused / today's (goal <= 0.25), the median time of `--repeats` passes,
   `time_ratio` fused / today's (goal <= 1.1), `max_logp_diff` (goal <= 1e-5 in fp32) and the
   largest |difference| of the gradients of the hidden states and of the projection (<= 1e-4).
   `--frozen-head`: the projection takes no gradient (LoRA on the other layers).
   On a GPU where `liger_kernel` imports, Liger's fused linear cross-entropy (reduction "none", its
   per-token log-probs negated) is a third contender on the same inputs: `liger_peak_memory_ratio`
   and `liger_time_ratio` (mmrl's fused / Liger's) and `liger_max_logp_diff` against today's path.
2. Whole GRPO steps of a tiny Qwen2 whose output layer spans `--vocab` tokens, each contender in
   a fresh process: mmrl with `policy.logprobs_from: hidden_states` and with `logits`, and TRL's
   GRPOTrainer (`--trl`), same prompts, G completions of exactly `--step-tokens` tokens, beta 0,
   fp32: median step time and peak RSS (CUDA: peak allocated) of each, and the ratios.

    python scripts/bench_logprob.py --json bench_logprob.json
    python scripts/bench_logprob.py --hidden 64 --vocab 8192 --tokens 256 --no-step  # a small run

prints and writes {"operator": [{hidden, tokens, peak_memory_ratio, time_ratio, max_logp_diff,
grad_hidden_max_diff, grad_weight_max_diff, ...}], "step": {...}, "machine": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_harness import digit_share, mmrl_recipe, peak_rss_mb, require_trl, trl_grpo_config, trl_step_timer
from memory_probe import peak_bytes
from bench_report import emit

from mmrl.tasks.lm.hidden_logprobs import hidden_state_logprobs
from mmrl.tasks.lm.token_logprobs import selective_log_softmax

STEP_PROMPTS = ["12+34=", "5+67=", "90+1=", "33+44="]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def operator_inputs(hidden: int, vocab: int, tokens: int, dtype: torch.dtype, device: str, frozen_head: bool):
    g = torch.Generator(device="cpu").manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g).to(device, dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) / hidden ** 0.5).to(device, dtype).requires_grad_(not frozen_head)
    targets = torch.randint(0, vocab, (tokens,), generator=g).to(device)
    weights = torch.randn(tokens, generator=g).to(device)
    return h, w, targets, weights


def log_prob_pass(path: str, h, w, targets, weights, chunk: int) -> torch.Tensor:
    """Forward and backward of sum_t weights_t log p(y_t); the log-probs (gradients in h, w)."""
    h.grad = w.grad = None
    if path == "fused":
        logp, _ = hidden_state_logprobs(h, w, targets, chunk_tokens=chunk)
    elif path == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        logp = -LigerFusedLinearCrossEntropyLoss(reduction="none")(w, h, targets)
    else:
        logp, _ = selective_log_softmax(F.linear(h, w), targets, chunk)
    (logp * weights).sum().backward()
    return logp.detach()


def seconds(fn, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def liger_available(device: str) -> bool:
    """Liger's kernels are Triton kernels: a contender on a GPU where the package imports."""
    if device != "cuda":
        return False
    try:
        import liger_kernel.transformers  # noqa: F401
    except ImportError:
        return False
    return True


def compare_operator(hidden: int, vocab: int, tokens: int, args, device: str) -> dict:
    h, w, targets, weights = operator_inputs(hidden, vocab, tokens, DTYPES[args.dtype], device, args.frozen_head)
    out, peaks, times = {}, {}, {}
    paths = ("fused", "today") + (("liger",) if liger_available(device) else ())
    for path in paths:
        logp = log_prob_pass(path, h, w, targets, weights, args.chunk)  # warm-up, and the values compared
        out[path] = (logp, h.grad, w.grad)
        peaks[path] = peak_bytes(lambda: log_prob_pass(path, h, w, targets, weights, args.chunk))  # noqa: B023
        times[path] = statistics.median(seconds(lambda: log_prob_pass(path, h, w, targets, weights, args.chunk),  # noqa: B023
                                                device) for _ in range(args.repeats))
    diff = [float((a.float() - b.float()).abs().max()) if a is not None else 0.0
            for a, b in zip(out["fused"], out["today"])]
    row = {"hidden": hidden, "vocab": vocab, "tokens": tokens, "dtype": args.dtype, "chunk_tokens": args.chunk,
            "frozen_head": args.frozen_head,
            "fused_peak_mb": round(peaks["fused"] / 2**20, 2), "today_peak_mb": round(peaks["today"] / 2**20, 2),
            "peak_memory_ratio": round(peaks["fused"] / peaks["today"], 4),
            "fused_s": round(times["fused"], 5), "today_s": round(times["today"], 5),
            "time_ratio": round(times["fused"] / times["today"], 4),
            "max_logp_diff": diff[0], "grad_hidden_max_diff": diff[1], "grad_weight_max_diff": diff[2]}
    if "liger" in paths:
        row.update({"liger_peak_mb": round(peaks["liger"] / 2**20, 2), "liger_s": round(times["liger"], 5),
                    "liger_peak_memory_ratio": round(peaks["fused"] / peaks["liger"], 4),
                    "liger_time_ratio": round(times["fused"] / times["liger"], 4),
                    "liger_max_logp_diff": float((out["liger"][0].float() - out["today"][0].float()).abs().max())})
    return row


# ----- whole GRPO steps, one contender per process ---------------------------------------------
def step_model_args(args) -> dict:
    return {"hidden": args.step_hidden, "layers": args.step_layers, "heads": 4, "seed": 0, "vocab": args.vocab}


def step_prompt_file(args) -> str:
    import tempfile
    path = os.path.join(tempfile.mkdtemp(prefix="mmrl-bench-data-"), "prompts.jsonl")
    with open(path, "w") as f:
        for p in STEP_PROMPTS[: args.prompts]:
            f.write(json.dumps({"prompt": p}) + "\n")
    return path


def mmrl_steps(args, source: str) -> list[float]:
    from mmrl.config.parse import parse_config
    from mmrl.train.loop.trainer import Trainer
    recipe = mmrl_recipe(args, "causal_lm",
                         {"model": "tiny:qwen2-char", "tiny_args": step_model_args(args), "max_new_tokens": args.tokens,
                          "min_new_tokens": args.tokens, "temperature": 1.0, "prefix_sharing": "off",
                          "logprobs_from": source, "logprob_check": False},
                         {"path": step_prompt_file(args)})
    trainer = Trainer(parse_config(recipe))
    times = []
    for k in range(args.warmup + args.steps):
        start = time.perf_counter()
        trainer.train_step()
        if k >= args.warmup:
            times.append(time.perf_counter() - start)
    return times


def trl_steps(args) -> list[float]:
    from datasets import Dataset
    from trl import GRPOTrainer

    from mmrl.tasks.demos.tiny_models import qwen2_char
    model, tok = qwen2_char(**step_model_args(args))
    data = Dataset.from_list([{"prompt": p} for p in STEP_PROMPTS[: args.prompts]] * (args.warmup + args.steps + 1))
    times: list[float] = []
    trainer = GRPOTrainer(model=model, reward_funcs=digit_share, args=trl_grpo_config(args), train_dataset=data,
                          processing_class=tok, callbacks=[trl_step_timer(args.warmup, times, [], None)])
    trainer.train()
    return times


def step_worker(args) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    times = trl_steps(args) if args.worker == "trl" else mmrl_steps(args, args.worker.removeprefix("mmrl_"))
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else peak_rss_mb()
    return {"times": times, "peak_mb": peak}


def compare_steps(args) -> dict:
    names = ["mmrl_hidden_states", "mmrl_logits"] + (["trl"] if args.trl else [])
    options = ["--vocab", str(args.vocab), "--step-hidden", str(args.step_hidden), "--step-layers",
               str(args.step_layers), "--step-tokens", str(args.tokens), "--step-group", str(args.group),
               "--step-prompts", str(args.prompts), "--step-steps", str(args.steps), "--step-warmup",
               str(args.warmup), "--threads", str(args.threads)]
    runs = {}
    for name in names:
        done = subprocess.run([sys.executable, __file__, "--worker", name, *options], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                                  os.environ.get("PYTHONPATH"), str(Path(__file__).resolve().parents[1])]))})
        if done.returncode != 0:
            sys.exit(f"the {name} worker failed:\n{done.stderr[-4000:]}")
        runs[name] = json.loads(done.stdout.strip().splitlines()[-1])
    med = {n: statistics.median(r["times"]) for n, r in runs.items()}
    peak = {n: r["peak_mb"] for n, r in runs.items()}
    out = {"median_step_s": {n: round(v, 4) for n, v in med.items()}, "peak_mb": {n: round(v, 1) for n, v in peak.items()},
           "time_ratio_vs_logits": round(med["mmrl_hidden_states"] / med["mmrl_logits"], 4),
           "peak_ratio_vs_logits": round(peak["mmrl_hidden_states"] / peak["mmrl_logits"], 4),
           "peak_measure": "cuda max allocated" if torch.cuda.is_available() else "process peak RSS",
           "vocab": args.vocab, "hidden": args.step_hidden, "layers": args.step_layers, "group": args.group,
           "prompts": args.prompts, "completion_tokens": args.tokens, "timed_steps": args.steps}
    if args.trl:
        out["trl_time_ratio"] = round(med["mmrl_hidden_states"] / med["trl"], 4)
        out["trl_peak_ratio"] = round(peak["mmrl_hidden_states"] / peak["trl"], 4)
    return out


def parse_args() -> argparse.Namespace:
    sizes = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the report here")
    p.add_argument("--hidden", type=sizes, default=[896, 3584], help="hidden sizes of the operator runs (comma list)")
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary (output layer rows), operator and step")
    p.add_argument("--tokens", type=sizes, default=[4096, 16384], help="tokens of the operator runs (comma list)")
    p.add_argument("--chunk", type=int, default=1024, help="tokens (fused) / rows (today's) per chunk")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the operator's inputs")
    p.add_argument("--frozen-head", action="store_true",
                   help="the projection takes no gradient (LoRA on the other layers): no gradient of the weight")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per operator path (the median is reported)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads")
    p.add_argument("--step", action=argparse.BooleanOptionalAction, default=True, help="also time whole GRPO steps")
    p.add_argument("--trl", action=argparse.BooleanOptionalAction, default=True,
                   help="TRL's GRPOTrainer beside the whole steps (pip install -e '.[bench]')")
    p.add_argument("--step-hidden", type=int, default=64, help="the tiny Qwen2's hidden size")
    p.add_argument("--step-layers", type=int, default=2, help="the tiny Qwen2's layers")
    p.add_argument("--step-tokens", dest="step_tokens", type=int, default=64, help="tokens per completion")
    p.add_argument("--step-group", dest="group", type=int, default=8, help="completions per prompt")
    p.add_argument("--step-prompts", dest="prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--step-steps", dest="steps", type=int, default=3, help="timed steps per contender")
    p.add_argument("--step-warmup", dest="warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.step and args.trl and args.worker is None and args.warmup < 1:
        p.error("--step-warmup must be at least 1 with --trl: TRL's step timer runs from one step's end to the next")
    if args.worker is None:  # the step's completion length travels to the workers as --step-tokens
        args.operator_tokens, args.tokens = args.tokens, args.step_tokens
    else:
        args.tokens = args.step_tokens
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(step_worker(args)))
        return
    require_trl(args.step and args.trl)
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    load = os.getloadavg()[0]
    report = {"operator": []}
    for h in args.hidden:
        for n in args.operator_tokens:
            report["operator"].append(compare_operator(h, args.vocab, n, args, device))
            print(json.dumps(report["operator"][-1]), file=sys.stderr, flush=True)  # kept if a later part fails
    if args.step:
        report["step"] = compare_steps(args)
    report.update({"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
                   "threads": args.threads, "date": time.strftime("%Y-%m-%d"),
                   "load_average": [round(load, 2), round(os.getloadavg()[0], 2)]})
    emit(report, args.json)


if __name__ == "__main__":
    main()
