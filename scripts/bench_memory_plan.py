"""`mmrl plan` against the allocation probe: for each size, the plan's peak (mmrl/experiments/memory_plan.py,
from the configuration alone) beside the probe's measure (scripts/memory_probe.py: CUDA's
max_memory_allocated, or the CPU profiler's allocation events) of the same recipe run for real in a
fresh process: the trainer built, then two GRPO steps of the tiny Qwen2 (`--layers`, random weights,
fp32; the second step holds AdamW's state; `--checkpointing`: with activation checkpointing), 2 prompts x `--group` completions of exactly N tokens,
one micro-batch; `--task dlm`: the masked diffusion LM (tiny:dlm-char, one block of N tokens decoded
in 2 steps, `--estimator`'s views); `--task diffusion`: a tiny diffusion pipeline (`--pipeline`; a size
is SIDExN: the image's side in pixels and N the denoiser's layers, or for the UNet its channels'
width, or for a video (wan-t2v) its frames; 4 denoising steps, classifier-free guidance where the family takes it);
`--task vlm`: the tiny Qwen2.5-VL (`--vlm-model`, a vision tower of
`--vision-hidden`, one `--image-side` square image per prompt, the processor's bound; the
character vocabulary). Prints JSON: per size the planned and measured MiB and their
ratio, for the whole peak and for the update passes alone (the training state under them).

    python scripts/bench_memory_plan.py --vocab 151936 --sizes 64x128,512x128,64x512,512x512 \\
        --json bench_memory_plan.json
    python scripts/bench_memory_plan.py --task dlm --estimator elbo --vocab 151936 --sizes 64x128
    python scripts/bench_memory_plan.py --task vlm --vocab 32000 --image-side 224 --sizes 64x32
    python scripts/bench_memory_plan.py --task diffusion --pipeline sd3 --sizes 64x2,128x2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

PROMPTS = ["01+20=", "11+21="]  # 6 tokens each of the character tokenizer
VLM_PROMPT_TOKENS = 27  # a prompt's chat text (Qwen-VL template) without its image's tokens
MIB = 2 ** 20
STATES = "rollouts' states (fp32 latents)"  # the diffusion plan's host memory from the rollout on


def recipe(hidden: int, tokens: int, args) -> dict:
    """The step's recipe (its prompt file written to a fresh directory)."""
    from mmrl.core.scoring import REWARDS, register_reward
    if "plan_length" not in REWARDS:
        register_reward("plan_length")(lambda completions, **kw: [float(len(c)) for c in completions])
    if "plan_pixels" not in REWARDS:  # distinct rewards of images (a video: its first frame) within a group
        register_reward("plan_pixels")(lambda completions, **kw: [
            float(sum((c[0] if isinstance(c, list) else c).getpixel((0, 0)))) for c in completions])
    if "plan_characters" not in REWARDS:  # distinct rewards within a group: no row is skipped by the update
        register_reward("plan_characters")(lambda completions, **kw: [float(sum(map(ord, c)) % 101) for c in completions])
    here = tempfile.mkdtemp(prefix="mmrl-plan-")
    image = os.path.join(here, "image.png")
    with open(os.path.join(here, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps({"prompt": p, "image": image}) + "\n" for p in PROMPTS)
    shape = {"hidden": hidden, "layers": args.layers, "heads": 4, "vocab": args.vocab or None, "max_positions": 16 + tokens}
    if args.task == "diffusion":
        return diffusion_recipe(hidden, tokens, args, here)
    if args.task == "vlm":
        from PIL import Image
        Image.new("RGB", (args.image_side, args.image_side), (90, 30, 200)).save(image)
        shape = {"hidden": hidden, "layers": args.layers, "heads": 4, "vision_hidden": args.vision_hidden,
                 "max_pixels": args.image_side ** 2}  # the character vocabulary
        policy = {"model": args.vlm_model, "max_new_tokens": tokens, "min_new_tokens": tokens, "prefix_sharing": "off"}
    elif args.task == "dlm":
        policy = {"model": "tiny:dlm-char", "gen_length": tokens, "block_length": tokens, "steps": 2,
                  "estimator": args.estimator, "logprobs_from": args.logprobs_from}
    else:
        policy = {"model": "tiny:qwen2-char", "max_new_tokens": tokens, "min_new_tokens": tokens}
    return {"task": args.task,
            "policy": {**policy, "gradient_checkpointing": args.checkpointing, "tiny_args": shape},
            "data": {"path": os.path.join(here, "prompts.jsonl")},
            "rewards": {"plan_characters" if args.task == "vlm" else "plan_length": {"weight": 1.0}},
            "algorithm": {"group_size": args.group, "estimator": "grpo", "beta": 0.0},
            "optim": {"lr": 1e-5, "prompts_per_step": len(PROMPTS), "micro_batch_size": len(PROMPTS) * args.group},
            "logging": {"report_to": ["none"], "progress": False}, "output_dir": os.path.join(here, "out"),
            "max_steps": 2, "save_every": 0}


# the tiny pipelines' builder arguments for a SIDExN size, whether the family guides by CFG, and
# whether N is the video's frames (else the denoiser's layers or width)
PIPELINES = {"pixel-flow": (lambda side, layers: {"size": side, "layers": layers, "patch": 2}, True, False),
             "pixel-flow-unet": (lambda side, width: {"size": side, "channels": [width, 2 * width]}, True, False),
             "sd3": (lambda side, layers: {"layers": layers}, True, False),
             "flux": (lambda side, layers: {"layers": layers}, False, False),
             "wan-t2v": (lambda side, frames: {}, True, True)}


def diffusion_recipe(side: int, layers: int, args, here: str) -> dict:
    tiny_args, guided, video = PIPELINES[args.pipeline]
    with open(os.path.join(here, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    policy = {"model": f"tiny:{args.pipeline}", "tiny_args": tiny_args(side, layers), "height": side, "width": side,
              "num_steps": 4, "classifier_free_guidance": guided, "gradient_checkpointing": args.checkpointing,
              "num_frames": layers if video else 1}
    return {"task": "diffusion", "policy": policy, "data": {"path": os.path.join(here, "prompts.jsonl")},
            "rewards": {"plan_pixels": {"weight": 1.0}},
            "algorithm": {"group_size": args.group, "estimator": "grpo", "beta": 0.0},
            "optim": {"lr": 1e-5, "prompts_per_step": len(PROMPTS), "micro_batch_size": len(PROMPTS) * args.group},
            "logging": {"report_to": ["none"], "progress": False}, "output_dir": os.path.join(here, "out"),
            "max_steps": 2, "save_every": 0}


def measured(hidden: int, tokens: int, args) -> tuple[int, int]:
    """The probe's peak bytes over building the trainer and two steps, in this process, and over
    their update passes."""
    import torch
    from memory_probe import MemoryProbe
    from mmrl.config.parse import parse_config
    from mmrl.train.loop.trainer import Trainer
    torch.manual_seed(0)
    probe = MemoryProbe()
    probe.start()
    trainer = Trainer(parse_config(recipe(hidden, tokens, args)))
    probe.phase(trainer.updater, "accumulate_gradients", "update")
    trainer.train_step()
    trainer.train_step()
    probe.stop()
    return probe.peak, probe.phases["update"]["peak"]


def planned(hidden: int, tokens: int, args) -> dict:
    from mmrl.config.parse import parse_config
    from mmrl.experiments.memory_plan import plan_memory
    prompt = VLM_PROMPT_TOKENS if args.task == "vlm" else len(PROMPTS[0])
    return plan_memory(parse_config(recipe(hidden, tokens, args)), 1, prompt_length=prompt).as_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=("causal_lm", "dlm", "vlm", "diffusion"), default="causal_lm", help="the adapter")
    parser.add_argument("--vlm-model", default="tiny:qwen2.5-vl-char", help="--task vlm: the tiny model")
    parser.add_argument("--vision-hidden", type=int, default=32, help="--task vlm: the vision tower's width")
    parser.add_argument("--image-side", type=int, default=112, help="--task vlm: the square image's side (pixels)")
    parser.add_argument("--pipeline", choices=sorted(PIPELINES), default="sd3", help="--task diffusion: the tiny pipeline")
    parser.add_argument("--estimator", default="diffu_grpo", help="--task dlm: the log-prob estimator")
    parser.add_argument("--logprobs-from", default="logits", help="--task dlm: logits or hidden_states")
    parser.add_argument("--vocab", type=int, default=151936, help="the output layer's tokens (0: the characters')")
    parser.add_argument("--sizes", default="64x128,512x128", help="HIDDENxTOKENS,... (completion tokens)")
    parser.add_argument("--group", type=int, default=2, help="completions per prompt (2 prompts)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--checkpointing", action="store_true", help="train with activation checkpointing")
    parser.add_argument("--worker", metavar="HIDDENxTOKENS", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    if args.worker:
        hidden, tokens = map(int, args.worker.split("x"))
        peak, update = measured(hidden, tokens, args)
        print(json.dumps({"peak": peak, "update": update}))
        return
    report = {"task": args.task, "vocab": args.vocab, "rows": len(PROMPTS) * args.group, "layers": args.layers,
              "checkpointing": args.checkpointing, "sizes": {}}
    if args.task == "dlm":
        report.update(estimator=args.estimator, logprobs_from=args.logprobs_from)
    if args.task == "diffusion":
        report.update(pipeline=args.pipeline)
    if args.task == "vlm":
        report.update(model=args.vlm_model, vision_hidden=args.vision_hidden, image_side=args.image_side)
    for size in args.sizes.split(","):
        hidden, tokens = map(int, size.split("x"))
        options = ["--vocab", str(args.vocab), "--group", str(args.group), "--layers", str(args.layers),
                   "--task", args.task, "--estimator", args.estimator, "--logprobs-from", args.logprobs_from,
                   "--vlm-model", args.vlm_model, "--vision-hidden", str(args.vision_hidden),
                   "--image-side", str(args.image_side), "--pipeline", args.pipeline]
        run = subprocess.run([sys.executable, __file__, "--worker", size, *options,
                              *(["--checkpointing"] if args.checkpointing else [])],
                             capture_output=True, text=True, check=True)
        probed = json.loads(run.stdout.strip().splitlines()[-1])
        plan = planned(hidden, tokens, args)
        update = sum(plan["state"].values()) + sum(plan["host"].values()) + sum(plan["update"].values())
        if plan["host"]:  # on a CPU the rollouts' host memory is the probe's too: all of it at the update, the
            # states (stored as the loop runs) at the rollout's end, where the conditioning is the same tensors
            rollout = sum(plan["state"].values()) + sum(plan["rollout"].values()) + plan["host"][STATES]
            plan["peak"] = max(update, rollout)
        report["sizes"][size] = {"planned_mib": round(plan["peak"] / MIB, 1), "measured_mib": round(probed["peak"] / MIB, 1),
                                 "ratio": round(plan["peak"] / probed["peak"], 4),
                                 "update_planned_mib": round(update / MIB, 1),
                                 "update_measured_mib": round(probed["update"] / MIB, 1),
                                 "update_ratio": round(update / probed["update"], 4),
                                 "update_mib": {k: round(v / MIB, 1) for k, v in plan["update"].items()}}
        print(json.dumps({size: report["sizes"][size]}), file=sys.stderr)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
