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
character vocabulary); `--task audio_lm`: the tiny Qwen2-Audio (a 1-layer encoder of `--audio-hidden`
over a `--window`-second window, one `--clip-seconds` tone per prompt; the character vocabulary);
`--task janus`: the tiny Janus (a VQ codebook of `--vocab` image tokens, `--patches` squared image
tokens per image, classifier-free guidance; N is ignored: the image's tokens are the completion);
`--task composite`: the tiny Qwen2 thinking N tokens (the character vocabulary, so its text is
N characters), then that tiny Janus drawing from its text (both trained). Prints JSON: per size the planned and measured MiB and their
ratio, for the whole peak and for the update passes alone (the training state under them).

    python scripts/bench_memory_plan.py --vocab 151936 --sizes 64x128,512x128,64x512,512x512 \\
        --json bench_memory_plan.json
    python scripts/bench_memory_plan.py --task dlm --estimator elbo --vocab 151936 --sizes 64x128
    python scripts/bench_memory_plan.py --task vlm --vocab 32000 --image-side 224 --sizes 64x32
    python scripts/bench_memory_plan.py --task audio_lm --window 2 --clip-seconds 1.9 --sizes 64x32
    python scripts/bench_memory_plan.py --task janus --vocab 16384 --patches 16 --sizes 64x0
    python scripts/bench_memory_plan.py --task composite --vocab 16384 --patches 8 --sizes 64x32
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
AUDIO_PROMPT_TOKENS = 28  # a prompt's chat text (Qwen2-Audio template) without its clip's tokens
JANUS_PROMPT_TOKENS = 7  # a prompt and the begin-of-image token
# each task's reward: one that differs within a group where completions are not all of one length
REWARD_OF = {"causal_lm": "plan_length", "dlm": "plan_length", "janus": "plan_brightness", "composite": "plan_brightness"}
MIB = 2 ** 20
STATES = "rollouts' states (fp32 latents)"  # the diffusion plan's host memory from the rollout on


def recipe(hidden: int, tokens: int, args) -> dict:
    """The step's recipe (its prompt file written to a fresh directory)."""
    from mmrl.core.scoring import REWARDS, register_reward
    if "plan_length" not in REWARDS:
        register_reward("plan_length")(lambda completions, **kw: [float(len(c)) for c in completions])
    if "plan_brightness" not in REWARDS:  # an image's mean pixel value: distinct within a group
        import numpy as np
        register_reward("plan_brightness")(lambda completions, **kw: [float(np.asarray(c.convert("L")).mean())
                                                                      for c in completions])
    if "plan_pixels" not in REWARDS:  # distinct rewards of images (a video: its first frame) within a group
        register_reward("plan_pixels")(lambda completions, **kw: [
            float(sum((c[0] if isinstance(c, list) else c).getpixel((0, 0)))) for c in completions])
    if "plan_characters" not in REWARDS:  # distinct rewards within a group: no row is skipped by the update
        register_reward("plan_characters")(lambda completions, **kw: [float(sum(map(ord, c)) % 101) for c in completions])
    here = tempfile.mkdtemp(prefix="mmrl-plan-")
    image = os.path.join(here, "image.png")
    with open(os.path.join(here, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps({"prompt": p, "image": image, "audio": image}) + "\n" for p in PROMPTS)
    shape = {"hidden": hidden, "layers": args.layers, "heads": 4, "vocab": args.vocab or None, "max_positions": 16 + tokens}
    if args.task == "diffusion":
        return diffusion_recipe(hidden, tokens, args, here)
    if args.task == "vlm":
        from PIL import Image
        Image.new("RGB", (args.image_side, args.image_side), (90, 30, 200)).save(image)
        shape = {"hidden": hidden, "layers": args.layers, "heads": 4, "vision_hidden": args.vision_hidden,
                 "max_pixels": args.image_side ** 2}  # the character vocabulary
        policy = {"model": args.vlm_model, "max_new_tokens": tokens, "min_new_tokens": tokens, "prefix_sharing": "off"}
    elif args.task == "audio_lm":
        import numpy as np
        import soundfile
        rate = 16000
        soundfile.write(image, np.sin(np.arange(int(args.clip_seconds * rate)) * 0.05).astype(np.float32), rate,
                        format="WAV")
        shape = {"hidden": hidden, "layers": args.layers, "heads": 4, "audio_hidden": args.audio_hidden,
                 "max_seconds": args.window}  # the character vocabulary
        policy = {"model": "tiny:qwen2-audio-char", "max_new_tokens": tokens, "min_new_tokens": tokens,
                  "prefix_sharing": "off"}
    elif args.task == "janus":
        shape = {"hidden": hidden, "layers": args.layers, "heads": 4, "codebook": args.vocab, "patches": args.patches}
        policy = {"model": "tiny:janus", "guidance_scale": 5.0}
    elif args.task == "composite":
        thinker = {"model": "tiny:qwen2-char", "max_new_tokens": tokens, "min_new_tokens": tokens,
                   "tiny_args": {**shape, "vocab": None}}  # characters: its text is a character per token
        generator = {"model": "tiny:janus", "guidance_scale": 5.0, "tiny_args": {
            "hidden": hidden, "layers": args.layers, "heads": 4, "codebook": args.vocab, "patches": args.patches}}
        policy, shape = {"thinker": thinker, "generator_task": "janus", "generator": generator}, None
    elif args.task == "dlm":
        policy = {"model": "tiny:dlm-char", "gen_length": tokens, "block_length": tokens, "steps": 2,
                  "estimator": args.estimator, "logprobs_from": args.logprobs_from}
    else:
        policy = {"model": "tiny:qwen2-char", "max_new_tokens": tokens, "min_new_tokens": tokens}
    if args.checkpointing:
        policy["gradient_checkpointing"] = True
    return {"task": args.task, "policy": {**policy, **({"tiny_args": shape} if shape else {})},
            "data": {"path": os.path.join(here, "prompts.jsonl")},
            "rewards": {REWARD_OF.get(args.task, "plan_characters"): {"weight": 1.0}},
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
             "wan-t2v": (lambda side, frames: {}, True, True),
             "qwen-image": (lambda side, layers: {"layers": layers}, True, False),
             "z-image": (lambda side, layers: {"layers": layers}, True, False),
             "flux2-klein": (lambda side, layers: {"layers": layers}, True, False),
             "sd15": (lambda side, n: {}, True, False)}
POLICY_OF = {"sd15": {"sampler": "ddim"}}  # a pipeline's settings other than the defaults (an eps model's sampler)


def diffusion_recipe(side: int, layers: int, args, here: str) -> dict:
    tiny_args, guided, video = PIPELINES[args.pipeline]
    with open(os.path.join(here, "prompts.jsonl"), "w") as f:
        f.writelines(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    policy = {"model": f"tiny:{args.pipeline}", "tiny_args": tiny_args(side, layers), "height": side, "width": side,
              "num_steps": 4, "classifier_free_guidance": guided, "gradient_checkpointing": args.checkpointing,
              "num_frames": layers if video else 1, **POLICY_OF.get(args.pipeline, {})}
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
    prompt = {"vlm": VLM_PROMPT_TOKENS, "audio_lm": AUDIO_PROMPT_TOKENS, "janus": JANUS_PROMPT_TOKENS}.get(
        args.task, len(PROMPTS[0]))
    return plan_memory(parse_config(recipe(hidden, tokens, args)), 1, prompt_length=prompt).as_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=("causal_lm", "dlm", "vlm", "audio_lm", "janus", "composite", "diffusion"),
                        default="causal_lm", help="the adapter")
    parser.add_argument("--vlm-model", default="tiny:qwen2.5-vl-char", help="--task vlm: the tiny model")
    parser.add_argument("--vision-hidden", type=int, default=32, help="--task vlm: the vision tower's width")
    parser.add_argument("--image-side", type=int, default=112, help="--task vlm: the square image's side (pixels)")
    parser.add_argument("--audio-hidden", type=int, default=32, help="--task audio_lm: the audio encoder's width")
    parser.add_argument("--window", type=int, default=2, help="--task audio_lm: the encoder's window (seconds)")
    parser.add_argument("--clip-seconds", type=float, default=1.9, help="--task audio_lm: each prompt's clip")
    parser.add_argument("--patches", type=int, default=8, help="--task janus: image tokens per side")
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
    if args.task == "audio_lm":
        report.update(audio_hidden=args.audio_hidden, window=args.window, clip_seconds=args.clip_seconds)
    if args.task == "diffusion":
        report.update(pipeline=args.pipeline)
    if args.task == "vlm":
        report.update(model=args.vlm_model, vision_hidden=args.vision_hidden, image_side=args.image_side)
    for size in args.sizes.split(","):
        hidden, tokens = map(int, size.split("x"))
        options = ["--vocab", str(args.vocab), "--group", str(args.group), "--layers", str(args.layers),
                   "--task", args.task, "--estimator", args.estimator, "--logprobs-from", args.logprobs_from,
                   "--vlm-model", args.vlm_model, "--vision-hidden", str(args.vision_hidden),
                   "--image-side", str(args.image_side), "--audio-hidden", str(args.audio_hidden),
                   "--window", str(args.window), "--clip-seconds", str(args.clip_seconds), "--patches", str(args.patches),
                   "--pipeline", args.pipeline]
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
