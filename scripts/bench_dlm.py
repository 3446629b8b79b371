"""Diffusion LMs: generation throughput and the cost of each log-prob estimator.

On the tiny bidirectional model (`tiny:dlm-char`, larger than the tests') and a tiny DiffusionGemma
(`tiny:diffusion-gemma`), in one process:

* generation tokens/s of mmrl's `block_decode` against a plain single-pass implementation of d1's
  ``generate`` (LLaDA's loop as d1 ships it: logits for the whole canvas at every step, float64
  softmax and Gumbel noise over the whole canvas from the global RNG, a per-row top-k loop). The
  two alternate, repetition by repetition, so machine load hits both alike; the ratio is reported,
  for the character vocabulary (100 tokens) and for the same model with its embeddings resized to
  `--large-vocab` tokens (LLaDA has 126k), where the per-step logits work d1 does on the whole
  canvas starts to count; and the peak memory one generation call allocates, each side's
  (scripts/memory_probe.py; mmrl's float64 sampler work is one group's at a time);
* per estimator (`diffu_grpo`, `coupled`, `elbo` with K points, `spg`, `espo`, `tracerl`,
  `agrpo`): model forward passes per `logprobs` call (`logprob_bounds` for spg), and the time of
  that call's forward + backward per completion token, also as a ratio to `diffu_grpo` measured
  alternately;
* DiffusionGemma: mmrl's block diffusion sampler (each group's noise from its seed) against the
  stock `DiffusionGemmaForBlockDiffusion.generate`, alternating repetition by repetition, with one
  group drawn by both from the same seed checked to be the same tokens; and its estimators'
  forward passes per call (decoder and encoder).

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
from memory_probe import peak_bytes  # noqa: E402
import mmrl.tasks  # noqa: E402,F401  (the tiny models)
from mmrl.tasks.dlm.block_diffusion_sampler import sample_block_diffusion  # noqa: E402
from mmrl.tasks.dlm.config import DLMConfig  # noqa: E402
from mmrl.tasks.dlm.estimators import LOGP_ESTIMATORS  # noqa: E402
from mmrl.tasks.dlm.generation import DecodeConfig, block_decode  # noqa: E402
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


ESTIMATORS = {"diffu_grpo": {}, "coupled": {}, "elbo": {"elbo_points": 4}, "elbo_k8": {"elbo_points": 8},
              "spg": {"spg_views": 2}, "espo": {"espo_samples": 2}, "tracerl": {"trace_shrink": 1},
              "agrpo": {"agrpo_samples": 4}}


def estimator_costs(policy: DLMPolicy, model, calls: list, args) -> dict:
    """Forward passes per call and time of forward + backward per completion token, per estimator."""
    batch = policy.rollout(PROMPTS, args.group, seeds=list(range(len(PROMPTS))))
    units = float(batch.unit_mask.sum())
    model.train()
    times = {name: [] for name in ESTIMATORS}
    forwards = {}
    for rep in range(args.reps + 1):
        for name, extra in ESTIMATORS.items():
            policy.cfg.estimator = name.split("_k")[0]
            for key, value in extra.items():
                setattr(policy.cfg, key, value)
            policy.estimate = LOGP_ESTIMATORS.get(policy.cfg.estimator)
            view = policy.pass_view(batch, rep)
            calls[0] = 0
            t0 = time.perf_counter()
            if name == "spg":
                lower, upper = policy.logprob_bounds(model, view)
                (lower.sum() + upper.sum()).backward()
            else:
                logp, _ = policy.logprobs(model, view)
                logp.sum().backward()
            elapsed = time.perf_counter() - t0
            model.zero_grad(set_to_none=True)
            forwards[name] = calls[0]
            if rep:  # the first repetition warms up
                times[name].append(elapsed)
    base = times["diffu_grpo"]
    out = {name: {"forwards_per_call": forwards[name], "ms_per_completion_token": 1000 * statistics.median(v) / units,
                  "time_ratio_to_diffu_grpo": statistics.median([a / b for a, b in zip(v, base)])}
           for name, v in times.items()}
    out["completion_tokens_scored"] = units
    return out


def diffusion_gemma_race(args) -> dict:
    """mmrl's block diffusion sampler against the stock generate, alternating; equal draws checked."""
    policy = DLMPolicy(DLMConfig(family="diffusion_gemma", model="tiny:diffusion-gemma", estimator="final_step",
                                 p_mask=0.0, gen_length=args.dg_canvas * args.dg_blocks, denoising_steps=args.dg_steps,
                                 tiny_args={"hidden": args.dg_hidden, "layers": args.layers, "heads": 4,
                                            "canvas": args.dg_canvas}))
    model, tok = policy.model.eval(), policy.tokenizer
    encoded = policy._encode(PROMPTS)
    ids = encoded["prompt_ids"].repeat_interleave(args.group, 0)
    mask = encoded["prompt_mask"].repeat_interleave(args.group, 0)
    length, rows = policy.cfg.gen_length, ids.shape[0]
    seeds = list(range(len(PROMPTS)))

    def ours():
        return sample_block_diffusion(model, ids, mask, {}, policy.cfg, policy.blocks, policy.eos_ids,
                                      tok.pad_token_id, seeds, args.group)

    def stock():
        torch.manual_seed(0)
        return model.generate(ids, attention_mask=mask, max_new_tokens=length, max_denoising_steps=args.dg_steps,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)

    torch.manual_seed(7)
    same = model.generate(ids[:args.group], max_new_tokens=length, max_denoising_steps=args.dg_steps,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).sequences[:, ids.shape[1]:]
    drawn = sample_block_diffusion(model, ids[:args.group], mask[:args.group], {}, policy.cfg, policy.blocks,
                                   policy.eos_ids, tok.pad_token_id, [7], args.group).completion_ids[:, :same.shape[1]]
    calls = count_forwards(model.model.decoder)  # `generate` calls the model's forward directly, the decoder through __call__
    times = {"mmrl": [], "stock": []}
    forwards = {}
    ours(), stock()  # warm-up
    for _ in range(args.reps):
        for name, fn in (("mmrl", ours), ("stock", stock)):
            calls[0] = 0
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            forwards[name] = calls[0]
    out = {name: {"median_s": statistics.median(v), "tokens_per_s": rows * length / statistics.median(v),
                  "decoder_forwards": forwards[name]} for name, v in times.items()}
    ratios = [s / m for m, s in zip(times["mmrl"], times["stock"])]
    out["speed_vs_stock"] = statistics.median(ratios)
    out["speed_vs_stock_range"] = [min(ratios), max(ratios)]
    out["one_group_same_tokens_as_stock"] = bool(torch.equal(drawn, same))
    out["estimators"] = diffusion_gemma_estimators(policy, seeds, args.group)
    out["setup"] = {"rows": rows, "canvas": args.dg_canvas, "blocks": args.dg_blocks,
                    "denoising_steps": args.dg_steps, "hidden": args.dg_hidden, "layers": args.layers}
    return out


def diffusion_gemma_estimators(policy: DLMPolicy, seeds: list[int], group: int) -> dict:
    """Decoder and encoder forward passes per `logprobs` call of each DiffusionGemma estimator."""
    batch = policy.rollout(PROMPTS, group, seeds=seeds)
    hf = policy.model
    decoder, encoder = count_forwards(hf.model.decoder), count_forwards(hf.model.encoder)
    out = {}
    for name in ("final_step", "diffu_grpo"):
        policy.cfg.estimator = name
        decoder[0] = encoder[0] = 0
        policy.logprobs(hf, batch)
        out[name] = {"decoder_forwards_per_call": decoder[0], "encoder_forwards_per_call": encoder[0]}
    return out


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
    ap.add_argument("--dg-hidden", type=int, default=128, help="DiffusionGemma's width")
    ap.add_argument("--dg-canvas", type=int, default=32, help="DiffusionGemma's canvas (block) length")
    ap.add_argument("--dg-blocks", type=int, default=2, help="canvases per completion")
    ap.add_argument("--dg-steps", type=int, default=16, help="DiffusionGemma's denoising steps per canvas")
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
        for name, fn in (("mmrl", ours), ("d1", d1)):
            out[name]["peak_mib"] = round(peak_bytes(fn) / 2 ** 20, 1)
        out["peak_memory_d1_over_mmrl"] = out["d1"]["peak_mib"] / out["mmrl"]["peak_mib"]
        return out

    gen = {"vocab_100": race()}

    est = estimator_costs(policy, model, calls, args)
    model.eval()
    model.resize_token_embeddings(args.large_vocab)
    gen[f"vocab_{args.large_vocab}"] = race()
    emit({
        "generation": gen,
        "estimators": est,
        "diffusion_gemma": diffusion_gemma_race(args),
        "setup": {"rows": rows, "gen_length": args.gen_length, "block_length": args.block_length,
                  "steps": args.steps, "threads": args.threads, "reps": args.reps, "model": model_args,
                  "loadavg_at_start": os.getloadavg()[0]},
    }, args.json)


if __name__ == "__main__":
    main()
