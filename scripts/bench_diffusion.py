"""The diffusion adapter's cost, measured against the stock diffusers pipeline and as the number
of trained steps grows (tiny random SD3 by default; `--model` names a real one on a GPU).

1. Rollout with log-probs (Flow-GRPO SDE, trajectory and log-probs kept) against the stock
   `StableDiffusion3Pipeline.__call__` for the same prompts, steps, batch and image size, timed
   alternately in the same process: rollout_overhead_ratio = ours / stock (goal <= 1.05).
2. One training step's backward work (`Trainer.accumulate_gradients`) as the number of trained
   steps grows: time, and peak memory = the largest autograd activation footprint of any one
   backward (bytes saved for backward, measured with saved-tensor hooks; on CUDA also
   max_memory_allocated). Steps are backpropagated one by one, so the peak must stay flat; the
   naive baseline (one backward over all trained steps) is measured beside it.

    python scripts/bench_diffusion.py --json scripts/results/bench_diffusion.json

`--family wan` measures the same for text-to-video: a tiny random Wan 2.1 (or `--model`) against the
stock `WanPipeline.__call__` with `--frames` frames, trained steps 1 and 8 by default (video latents
[B, C, F, H, W]; the trajectory stays on the CPU and moves to the device a step at a time).

    python scripts/bench_diffusion.py --family wan --json scripts/results/bench_diffusion_wan.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_report import emit


class SavedBytes:
    """Bytes autograd saves for backward, the most held by one backward graph."""

    def __init__(self):
        self.current = self.peak = 0

    def pack(self, t):
        self.current += t.numel() * t.element_size()
        self.peak = max(self.peak, self.current)
        return t

    def unpack(self, t):
        return t


# --family: (default model, stock-call settings of a video family, a reward that reads its completions)
FAMILIES = {"sd3": ("tiny:sd3", False, {"colour_shape": {"weight": 1.0}}),
            "wan": ("tiny:wan-t2v", True, {"colour_shape": {"weight": 1.0, "args": {"frames": "all"}}})}


def rollout_overhead(policy, prompts, group_size, repeats):
    pipe, cfg = policy.pipe, policy.cfg
    stock_prompts = [p for p in prompts for _ in range(group_size)]
    video = {"num_frames": cfg.num_frames} if cfg.num_frames > 1 else {}

    def ours():
        policy.rollout(prompts, group_size, list(range(len(prompts))))

    def stock():
        pipe(prompt=stock_prompts, num_inference_steps=cfg.num_steps, height=cfg.height, width=cfg.width,
             guidance_scale=cfg.guidance_scale, generator=torch.Generator().manual_seed(0), output_type="pil",
             **video)
    pipe.set_progress_bar_config(disable=True)
    ours(), stock()  # warm-up
    times = {"ours": [], "stock": []}
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("stock", stock)):
            t0 = time.perf_counter()
            with torch.no_grad():
                fn()
            times[name].append(time.perf_counter() - t0)
    ratios = [o / s for o, s in zip(times["ours"], times["stock"])]
    return {"rollout_overhead_ratio": statistics.median(ratios), "rollout_ratio_min": min(ratios),
            "rollout_ratio_max": max(ratios), "rollout_s_ours": statistics.median(times["ours"]),
            "rollout_s_stock": statistics.median(times["stock"])}


def training_step(model, size, frames, family, steps, layers, group_size, repeats, tmp):
    from mmrl.config.parse import parse_config
    from mmrl.train.trainer import Trainer
    _, _, rewards = FAMILIES[family]
    recipe = {"task": "diffusion",
              "policy": {"model": model, "tiny_args": {"layers": layers} if model.startswith("tiny:") else {},
                         "height": size, "width": size, "num_frames": frames, "num_steps": steps + 1,
                         "noise_level": 0.7},
              "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 0, "size": 32}},
              "rewards": rewards,
              "algorithm": {"group_size": group_size},
              "optim": {"prompts_per_step": 1, "micro_batch_size": group_size},
              "logging": {"report_to": ["none"], "progress": False}, "output_dir": tmp, "max_steps": 1}
    t = Trainer(parse_config(recipe))
    batch = t.prepare_batch(1)
    batch.advantages = torch.linspace(-1, 1, len(batch.advantages))  # every row carries gradient
    chunks = t.updater.micro_batches(batch)
    out = {"trained_steps": steps}
    for mode in ("per_step", "one_backward"):
        if mode == "one_backward":  # the naive baseline: every trained step in one graph
            t.policy.unit_slices = lambda mb: [slice(None)]
        saved, times = _measure(t, batch, chunks, repeats)
        out[f"time_s_{mode}"] = statistics.median(times)
        out[f"peak_activation_bytes_{mode}"] = saved.peak
        if torch.cuda.is_available():
            out[f"cuda_max_memory_allocated_{mode}"] = torch.cuda.max_memory_allocated()
    return out


def _measure(t, batch, chunks, repeats):
    saved = SavedBytes()
    times = []
    for _ in range(repeats):
        t.optimizer.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        original = t.policy.logprobs

        def counted(*a, **k):  # each unit slice starts a fresh graph
            saved.current = 0
            return original(*a, **k)  # noqa: B023 (this iteration's; replaced each time)
        t.policy.logprobs = counted
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            t.updater.accumulate_gradients(batch, chunks, None, None, with_entropy=False)
        times.append(time.perf_counter() - t0)
        t.policy.logprobs = original
    return saved, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--family", choices=list(FAMILIES), default="sd3")
    parser.add_argument("--model", help="a pipeline (hub id or path); default: the family's tiny model")
    parser.add_argument("--frames", type=int, default=5, help="video frames (--family wan)")
    parser.add_argument("--layers", type=int, default=4, help="transformer layers of the tiny model")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--trained-steps", help="default 1,2,4,8,16 (images), 1,8 (video)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    default_model, video, _ = FAMILIES[args.family]
    args.model = args.model or default_model
    args.trained_steps = args.trained_steps or ("1,8" if video else "1,2,4,8,16")
    frames = args.frames if video else 1
    torch.set_num_threads(args.threads)
    import os
    import tempfile

    from mmrl.tasks.diffusion.config import DiffusionConfig
    from mmrl.tasks.diffusion.policy import DiffusionPolicy
    policy = DiffusionPolicy(DiffusionConfig(
        model=args.model, tiny_args={"layers": args.layers} if args.model.startswith("tiny:") else {},
        height=args.size, width=args.size, num_frames=frames, num_steps=args.steps, noise_level=0.7))
    prompts = [f"red circle {i}" for i in range(args.prompts)]
    report = {"family": args.family, "model": args.model, "layers": args.layers, "size": args.size,
              "frames": frames, "steps": args.steps,
              "batch": args.prompts * args.group_size, "threads": args.threads,
              "load_avg_1min": os.getloadavg()[0]}
    report.update(rollout_overhead(policy, prompts, args.group_size, args.repeats))
    with tempfile.TemporaryDirectory() as tmp:
        report["training_step"] = [training_step(args.model, args.size, frames, args.family, int(s), args.layers, args.group_size,
                                                 max(1, args.repeats // 2), tmp)
                                   for s in args.trained_steps.split(",")]
    for mode in ("per_step", "one_backward"):
        peaks = [r[f"peak_activation_bytes_{mode}"] for r in report["training_step"]]
        report[f"peak_activation_growth_{mode}"] = peaks[-1] / peaks[0]
    report["load_avg_1min_end"] = os.getloadavg()[0]
    emit(report, args.json)


if __name__ == "__main__":
    main()
