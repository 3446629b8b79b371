"""Masked diffusion LM: generation throughput and the cost of each log-prob estimator.

On the tiny bidirectional model (`tiny:dlm-char`, larger than the tests'), in one process:

* generation tokens/s of mmrl's `block_decode` against a plain single-pass implementation of d1's
  ``generate`` (LLaDA's loop as d1 ships it: logits for the whole canvas at every step, float64
  softmax and Gumbel noise over the whole canvas from the global RNG, a per-row top-k loop). The
  two alternate, repetition by repetition, so machine load hits both alike; the ratio is reported,
  for the character vocabulary (100 tokens) and for the same model with its embeddings resized to
  `--large-vocab` tokens (LLaDA has 126k), where the per-step logits work d1 does on the whole
  canvas starts to count;
* per estimator (`diffu_grpo`, `coupled`, `elbo` with K points): model forward passes per
  `logprobs` call, and the time of `logprobs` forward + backward per completion token, also as a
  ratio to `diffu_grpo` measured alternately.

    python scripts/bench_dlm.py --json scripts/results/bench_dlm.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_report import emit  # noqa: E402
from mmrl.tasks.dlm.generation import DecodeConfig, block_decode  # noqa: E402
from mmrl.tasks.dlm.config import DLMConfig  # noqa: E402
from mmrl.tasks.dlm.policy import DLMPolicy  # noqa: E402

PROMPTS = ["12+34=", "56+78=", "90+12=", "33+44="]  # one length: d1 passes no attention mask
MODEL = {"hidden": 256, "layers": 4, "heads": 4, "seed": 0}


@torch.no_grad()
def d1_generate(model, prompt, steps, gen_length, block_length, temperature, mask_id):
    """d1's generate (LLaDA's reference loop), one full-canvas forward per step."""
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, :prompt.shape[1]] = prompt
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    for b in range(num_blocks):
        start, end = prompt.shape[1] + b * block_length, prompt.shape[1] + (b + 1) * block_length
        block_masks = (x[:, start:end] == mask_id).sum(1, keepdim=True)
        base, rem = block_masks // steps_per_block, block_masks % steps_per_block
        counts = base.expand(-1, steps_per_block).clone()
        counts[torch.arange(steps_per_block)[None, :] < rem] += 1
        for i in range(steps_per_block):
            mask_index = x == mask_id
            logits = model(x).logits
            z = logits.double()
            noise = torch.rand_like(z)
            x0 = (z.exp() / (-torch.log(noise)) ** temperature).argmax(-1)
            p = torch.softmax(z, -1)
            x0_p = p.gather(-1, x0[..., None]).squeeze(-1)
            x0_p[:, end:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-np.inf, dtype=x0_p.dtype))
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                k = int(counts[j, i])
                if k > 0:
                    transfer[j, confidence[j].topk(k).indices] = True
            x[transfer] = x0[transfer]
    return x


def count_forwards(model):
    calls = [0]
    model.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    return calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions (medians are reported)")
    ap.add_argument("--group", type=int, default=8, help=f"completions per prompt ({len(PROMPTS)} prompts)")
    ap.add_argument("--gen-length", type=int, default=64, help="tokens generated per completion")
    ap.add_argument("--block-length", type=int, default=16, help="tokens per semi-autoregressive block")
    ap.add_argument("--steps", type=int, default=32, help="denoising steps over the whole completion")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads")
    ap.add_argument("--large-vocab", type=int, default=32768, help="vocabulary of the second generation race")
    ap.add_argument("--hidden", type=int, default=MODEL["hidden"], help="model width")
    ap.add_argument("--layers", type=int, default=MODEL["layers"], help="model depth")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_args = {**MODEL, "hidden": args.hidden, "layers": args.layers}
    policy = DLMPolicy(DLMConfig(model="tiny:dlm-char", tiny_args=model_args, gen_length=args.gen_length,
                                 block_length=args.block_length, steps=args.steps))
    model = policy.model.eval()
    calls = count_forwards(model)
    ids, mask = policy._encode(PROMPTS)
    rows = len(PROMPTS) * args.group
    ids_r, mask_r = ids.repeat_interleave(args.group, 0), mask.repeat_interleave(args.group, 0)
    decode = DecodeConfig(args.gen_length, args.block_length, args.steps, temperature=1.0)
    tokens = rows * args.gen_length

    def ours():
        block_decode(lambda x, a, p: policy.logits(model, x, a, p), ids_r, mask_r, decode, policy.mask_id,
                     policy.eos_ids[0], list(range(len(PROMPTS))), args.group)

    def d1():
        d1_generate(model, ids_r, args.steps, args.gen_length, args.block_length, 1.0, policy.mask_id)

    def race() -> dict:
        times = {"mmrl": [], "d1": []}
        forwards = {}
        ours(), d1()  # warm-up
        for _ in range(args.reps):
            for name, fn in (("mmrl", ours), ("d1", d1)):
                calls[0] = 0
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                forwards[name] = calls[0]
        out = {name: {"median_s": statistics.median(v), "tokens_per_s": tokens / statistics.median(v),
                      "forwards": forwards[name]} for name, v in times.items()}
        ratios = [d / m for m, d in zip(times["mmrl"], times["d1"])]
        out["speedup_vs_d1"] = statistics.median(ratios)
        out["speedup_vs_d1_range"] = [min(ratios), max(ratios)]
        return out

    gen = {"vocab_100": race()}

    batch = policy.rollout(PROMPTS, args.group, seeds=list(range(len(PROMPTS))))
    units = float(batch.unit_mask.sum())
    model.train()
    estimators = {"diffu_grpo": {}, "coupled": {}, "elbo": {"elbo_points": 4}, "elbo_k8": {"elbo_points": 8}}
    est_times = {name: [] for name in estimators}
    est_forwards = {}
    from mmrl.tasks.dlm.estimators import LOGP_ESTIMATORS
    for rep in range(args.reps + 1):
        for name, extra in estimators.items():
            policy.cfg.estimator = name.split("_k")[0]
            policy.cfg.elbo_points = extra.get("elbo_points", 4)
            policy.estimate = LOGP_ESTIMATORS.get(policy.cfg.estimator)
            calls[0] = 0
            t0 = time.perf_counter()
            logp, _ = policy.logprobs(model, policy.pass_view(batch, rep))
            (logp.sum()).backward()
            elapsed = time.perf_counter() - t0
            model.zero_grad(set_to_none=True)
            est_forwards[name] = calls[0]
            if rep:  # the first repetition warms up
                est_times[name].append(elapsed)
    base = est_times["diffu_grpo"]
    est = {name: {"forwards_per_call": est_forwards[name],
                  "ms_per_completion_token": 1000 * statistics.median(v) / units,
                  "time_ratio_to_diffu_grpo": statistics.median([a / b for a, b in zip(v, base)])}
           for name, v in est_times.items()}
    model.eval()
    model.resize_token_embeddings(args.large_vocab)
    gen[f"vocab_{args.large_vocab}"] = race()
    emit({
        "generation": gen,
        "estimators": est,
        "setup": {"rows": rows, "gen_length": args.gen_length, "block_length": args.block_length,
                  "steps": args.steps, "threads": args.threads, "reps": args.reps, "model": model_args,
                  "completion_tokens_scored": units,
                  "loadavg_at_start": os.getloadavg()[0]},
    }, args.json)


if __name__ == "__main__":
    main()
