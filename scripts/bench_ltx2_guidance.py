"""The cost of LTX-2's guidance terms beyond CFG (`policy.stg_scale`, `policy.modality_scale`,
`policy.guidance_rescale`) in a training step: a rollout's denoising step (the guided velocity,
no gradient) and a trained step (the guided velocity's forward and backward through every pass),
each timed with the terms on against CFG alone on the same tiny random LTX-2, alternated in one
process, medians of --repeats of the process's CPU seconds. Prints JSON: the seconds and each setting's ratio to CFG alone.

    python scripts/bench_ltx2_guidance.py --json scripts/results/bench_ltx2_guidance.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_report import emit

SETTINGS = {"cfg": {}, "cfg+stg": {"stg_scale": 1.0, "stg_blocks": [0]}, "cfg+modality": {"modality_scale": 3.0},
            "cfg+rescale": {"guidance_rescale": 0.7},
            "cfg+all": {"stg_scale": 1.0, "stg_blocks": [0], "modality_scale": 3.0, "guidance_rescale": 0.7}}


def policy_of(args, terms: dict):
    from mmrl.tasks.diffusion.config import DiffusionConfig
    from mmrl.tasks.diffusion.policy import DiffusionPolicy
    return DiffusionPolicy(DiffusionConfig(
        model="tiny:ltx2", tiny_args={"layers": args.layers, "perturbed_attn": True}, height=args.size, width=args.size,
        num_frames=args.frames, num_steps=4, eval_num_steps=4, guidance_scale=3.0, **terms))


def step_inputs(policy, rows: int):
    """One denoising step's inputs: latents [rows, D], the model timestep, the conditioning [rows, ...]."""
    fam = policy.family
    x = torch.cat([fam.noise(torch.Generator().manual_seed(i), *fam.size) for i in range(rows)])
    cond = fam.condition(["a dog barks"] * rows, None, True)
    _, timesteps = fam.levels(4, tuple(x.shape))
    return x, timesteps[1], cond


def seconds(fn, *args) -> float:
    """The process's CPU seconds of fn(*args) (one thread: less swayed than wall time by a loaded machine)."""
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def forwards(policy, fn) -> int:
    """The transformer calls fn(policy) makes."""
    calls = []
    handle = policy.model.register_forward_hook(lambda *_: calls.append(1))
    fn(policy)
    handle.remove()
    return len(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks of the tiny model")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--rows", type=int, default=2, help="rollouts in the step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    policies = {name: policy_of(args, terms) for name, terms in SETTINGS.items()}
    x, t, cond = step_inputs(policies["cfg"], args.rows)
    times: dict[str, dict[str, list[float]]] = {name: {"rollout": [], "train": []} for name in SETTINGS}

    def rollout(policy):
        with torch.no_grad():
            policy.family.predict(policy.model, x, t, cond, 3.0, True)

    def train(policy):
        policy.family.predict(policy.model, x, t, cond, 3.0, True).square().mean().backward()
        policy.model.zero_grad(set_to_none=True)

    for _ in range(args.repeats):  # alternated, so that the machine's load falls on every setting alike
        for name, policy in policies.items():
            times[name]["rollout"].append(seconds(rollout, policy))
            times[name]["train"].append(seconds(train, policy))
    median = {name: {phase: statistics.median(v) for phase, v in phases.items()} for name, phases in times.items()}
    report = {"what": "one denoising step of tiny:ltx2 (guided velocity; train = its forward and backward)",
              "layers": args.layers, "size": args.size, "frames": args.frames, "rows": args.rows,
              "repeats": args.repeats, "threads": args.threads, "seconds_median": median,
              "ratio_to_cfg": {name: {phase: round(m[phase] / median["cfg"][phase], 2) for phase in m}
                               for name, m in median.items()},
              "transformer_calls_per_step": {name: forwards(policy, rollout) for name, policy in policies.items()}}
    emit(report, args.json)


if __name__ == "__main__":
    main()
