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

`--methods all` (or a comma list of METHODS) measures instead the cost of one whole training step
(`Trainer.train_step`: rollout, rewards, update) per diffusion method against DanceGRPO's, each a
Trainer on the same tiny model, step count, prompts per step, group size and micro-batch size, CFG
off, full fine-tuning, with only the method's switches taken from its recipe (tasks/recipes/t2i_*.yaml;
MixGRPO: DanceGRPO's with a sliding window). The reward is the images' mean brightness (Pref-GRPO:
its win rate), so that no group ties and every row trains. After one warm-up step, the median of
`--repeats` steps: denoiser forwards and the rows they took (forward hooks on the policy's and the
reference's denoiser, rollout and update apart; rows: each call's batch size, summed), time, the
saved-for-backward peak (on CUDA also max_memory_allocated), the final samples a step trains, and
each against DanceGRPO's (`*_vs_dance`).

    python scripts/bench_diffusion.py --methods all --json scripts/results/bench_diffusion_methods.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

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
    from mmrl.train.loop.trainer import Trainer
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


RECIPES = Path(__file__).resolve().parents[1] / "tasks" / "recipes"
METHODS = ("dancegrpo", "flowgrpo", "flowgrpo_fast", "mixgrpo", "grpo_guard", "nft", "flowdppo", "pref_grpo",
           "branchgrpo", "chunk", "turning_point")
# what a method's recipe switches; the rest (model, sizes, batch, optimizer) is the benchmark's
POLICY_SWITCHES = ("sampler", "noise_level", "cps_logprob", "kl_form", "schedule", "units", "forward_fraction",
                   "branching", "turning_points", "tp_max_extra_passes")
# MixGRPO (Li et al. 2025) has no recipe: DanceGRPO's with the SDE and training in a sliding window
# (their window of 4 steps, moved by 1 every 25 iterations)
MIXGRPO_SCHEDULE = {"kind": "sliding_window", "start": 0, "size": 4, "stride": 1, "shift_every": 25}


def image_brightness(prompts, completions, **columns):
    """The benchmark's reward: each image's mean pixel value in [0, 1] (continuous: a group of distinct samples does not tie)."""
    import numpy as np
    return [float(np.asarray(image.convert("L"), dtype=np.float32).mean() / 255) for image in completions]


def brighter(a, b) -> float:
    """Pref-GRPO's pairwise judge in the benchmark: 1 if image `a` is brighter than `b`."""
    sa, sb = image_brightness(None, [a, b])
    return 1.0 if sa > sb else 0.0 if sa < sb else 0.5


def fitted_chunks(sizes: list[int], steps: int) -> list[int]:
    """Chunk sizes rescaled to sum to `steps` (largest remainders), each at least 1."""
    exact = [s * steps / sum(sizes) for s in sizes]
    out = [max(1, int(e)) for e in exact]
    for i in sorted(range(len(sizes)), key=lambda i: int(exact[i]) - exact[i])[:steps - sum(out)]:
        out[i] += 1
    if sum(out) != steps:
        raise SystemExit(f"chunk sizes {sizes} cannot be fitted to {steps} steps; use more --steps")
    return out


def method_switches(method: str, steps: int) -> tuple[dict, dict, dict]:
    """(policy switches, algorithm section without group_size, rewards) of `method`'s recipe."""
    import yaml
    recipe = yaml.safe_load((RECIPES / f"t2i_{'dancegrpo' if method == 'mixgrpo' else method}.yaml").read_text())
    policy = {k: v for k, v in recipe["policy"].items() if k in POLICY_SWITCHES}
    algorithm = {k: v for k, v in recipe["algorithm"].items() if k != "group_size"}
    if method == "mixgrpo":
        policy["schedule"] = dict(MIXGRPO_SCHEDULE)
    if policy.get("schedule", {}).get("kind") == "chunks":
        policy["schedule"]["sizes"] = algorithm["chunks"] = fitted_chunks(algorithm["chunks"], steps)
    here = Path(__file__).resolve()
    if "win_rate" in recipe["rewards"]:
        win_rate = recipe["rewards"]["win_rate"]
        rewards = {"win_rate": {**win_rate, "args": {**win_rate["args"], "prefer": f"{here}:brighter"}}}
    else:
        rewards = {f"{here}:image_brightness": {"weight": 1.0}}
    return policy, algorithm, rewards


class ForwardCounter:
    """Calls of the denoiser modules and the rows they took (each call's batch size, summed),
    counted per phase of a step ("rollout" or "update")."""

    def __init__(self, modules):
        self.phase = "rollout"
        self.reset()
        self.handles = [m.register_forward_hook(self._count, with_kwargs=True) for m in {id(m): m for m in modules}.values()]

    def reset(self) -> None:
        self.counts, self.rows = {"rollout": 0, "update": 0}, {"rollout": 0, "update": 0}

    def _count(self, module, args, kwargs, output):
        self.counts[self.phase] += 1
        latents = kwargs.get("hidden_states", kwargs.get("sample", args[0] if args else None))
        self.rows[self.phase] += latents.shape[0]

    def in_phase(self, phase: str, fn):
        def run(*a, **k):
            self.phase = phase
            return fn(*a, **k)
        return run


def method_step_cost(method: str, args, tmp: str) -> dict:
    """One method's whole training steps, after a warm-up step: forwards, time, peak, samples trained."""
    from mmrl.config.parse import parse_config
    from mmrl.train.loop.trainer import Trainer
    policy, algorithm, rewards = method_switches(method, args.steps)
    recipe = {"task": "diffusion",
              "policy": {"model": args.model, "tiny_args": {"layers": args.layers} if args.model.startswith("tiny:") else {},
                         "height": args.size, "width": args.size, "num_steps": args.steps,
                         "eval_num_steps": args.steps, "classifier_free_guidance": False, **policy},
              "data": {"name": "colour_shapes", "args": {"n_train": 64, "n_eval": 0, "size": 32}},
              "rewards": rewards, "algorithm": {**algorithm, "group_size": args.group_size},
              "optim": {"prompts_per_step": args.prompts, "micro_batch_size": args.micro_batch},
              "logging": {"report_to": ["none"], "progress": False}, "output_dir": f"{tmp}/{method}",
              "max_steps": args.repeats + 1}
    t = Trainer(parse_config(recipe))
    try:
        return _timed_steps(t, args.repeats)
    finally:
        t.release_output_dir()


def _timed_steps(t, repeats: int) -> dict:
    counter = ForwardCounter([m for m in (t.policy.family.denoiser, t.unwrapped, t.reference) if m is not None])
    saved, batches = SavedBytes(), []
    prepare, update, backward = t.prepare_batch, t.updater.update, t.strategy.backward

    def prepared(step):
        batches.append(prepare(step))
        return batches[-1]

    def backward_then_reset(*a, **k):  # each backward frees its graph: the next one starts at 0
        backward(*a, **k)
        saved.current = 0
    t.prepare_batch, t.updater.update = counter.in_phase("rollout", prepared), counter.in_phase("update", update)
    t.strategy.backward = backward_then_reset
    runs = []
    for _ in range(repeats + 1):
        counter.reset()
        saved.current = saved.peak = 0
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            t.train_step()
        run = {"time_s": time.perf_counter() - t0, "forwards_rollout": counter.counts["rollout"],
               "forwards_update": counter.counts["update"], "rows_rollout": counter.rows["rollout"],
               "rows_update": counter.rows["update"], "peak_activation_bytes": saved.peak,
               **_trained(batches[-1])}
        if torch.cuda.is_available():
            run["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated()
        runs.append(run)
    for h in counter.handles:
        h.remove()
    measured = runs[1:]  # after the warm-up step
    out = {k: statistics.median(r[k] for r in measured) for k in measured[0]}
    out["forwards"] = out["forwards_rollout"] + out["forwards_update"]
    out["time_s_per_trained_sample"] = out["time_s"] / out["samples_trained"]
    out["forwards_each"] = [[r["forwards_rollout"], r["forwards_update"]] for r in measured]
    out["rows_each"] = [[r["rows_rollout"], r["rows_update"]] for r in measured]
    return out


def _trained(batch) -> dict:
    """The final samples of a step's batch, those it trains (a trained unit and a non-zero
    advantage) and their trained units."""
    from mmrl.core.advantages import row_magnitude
    rollout = batch.rollout
    active = batch.row_mask & (row_magnitude(batch.advantages) > 0) & (rollout.unit_mask.sum(1) > 0)
    return {"samples": len(rollout), "samples_trained": int(active.sum()),
            "units_trained": int(rollout.unit_mask[active].sum())}


def method_costs(args) -> dict:
    """Every method of `args.methods` (DanceGRPO first, the reference) and its cost against DanceGRPO's."""
    import tempfile
    names = [m for m in args.methods.split(",")] if args.methods != "all" else list(METHODS)
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise SystemExit(f"--methods: {unknown} not among {list(METHODS)}")
    names = ["dancegrpo"] + [m for m in names if m != "dancegrpo"]
    with tempfile.TemporaryDirectory() as tmp:
        costs = {m: method_step_cost(m, args, tmp) for m in names}
    keys = ("forwards", "time_s", "time_s_per_trained_sample", "peak_activation_bytes", "cuda_max_memory_allocated")
    for cost in costs.values():
        cost.update({f"{k}_vs_dance": cost[k] / costs["dancegrpo"][k] for k in keys if k in cost})
    return costs


def methods_report(args) -> dict:
    import os
    if args.family != "sd3":
        raise SystemExit("--methods measures the image methods (--family sd3)")
    args.micro_batch = args.micro_batch or args.group_size
    report = {"model": args.model, "layers": args.layers, "size": args.size, "steps": args.steps,
              "prompts_per_step": args.prompts, "group_size": args.group_size, "micro_batch": args.micro_batch,
              "repeats": args.repeats, "threads": args.threads, "cuda": torch.cuda.is_available(),
              "load_avg_1min": os.getloadavg()[0]}
    report["methods"] = method_costs(args)
    report["load_avg_1min_end"] = os.getloadavg()[0]
    return report


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
    parser.add_argument("--methods", help=f"'all' or a comma list of {', '.join(METHODS)}: each method's training "
                                          "step against DanceGRPO's, instead of the measurements above")
    parser.add_argument("--micro-batch", type=int, help="--methods: rows per micro-batch (default: --group-size)")
    args = parser.parse_args()
    default_model, video, _ = FAMILIES[args.family]
    args.model = args.model or default_model
    torch.set_num_threads(args.threads)
    if args.methods:
        return emit(methods_report(args), args.json)
    args.trained_steps = args.trained_steps or ("1,8" if video else "1,2,4,8,16")
    frames = args.frames if video else 1
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
