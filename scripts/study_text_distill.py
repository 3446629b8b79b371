"""The text distillation study (docs/results/distill_text/): a smaller student of the text demo's
RL-trained teacher, by on-policy distillation (alone, and beside the reward), by GRPO on the reward,
and by supervised distillation on the teacher's samples, at equal student compute, 3 seeds each.

1. The teacher (a checkpoint of `mmrl demo text`: its `model/` folder, built as the run builds
   `algorithm.distill.teacher`) samples one completion per training prompt at its rollout
   temperature; the rows are written with it (`teacher_target`) beside the data's own `target`.
2. `mmrl sweep text_opd` runs the cells. Every RL cell starts from the same supervised warm start of
   the student (`--warm-steps` on `--warm-target`: the data's own targets, or the teacher's samples,
   off-policy distillation first as Thinking Machines' OPD runs do) and takes the same RL steps and
   rollouts; the supervised cell trains on `teacher_target` from the start, for as many student FLOPs
   as the warm start plus the RL steps take (`student_flops`), and is scored when its warm start
   ends (the sweep runs one RL step after it, not counted).
3. Each cell's held-out exact match (the accuracy reward: greedy, and the sampled mean) against
   student FLOPs, into OUT/distill.png, with the numbers in OUT/study.json.

    python scripts/study_text_distill.py --teacher outputs/text_demo/checkpoints/step-000600/model \\
        --out docs/results/distill_text/from_targets --seeds 3 --steps 150 --parallel 2
    python scripts/study_text_distill.py --teacher outputs/text_demo/checkpoints/step-000600/model \\
        --out docs/results/distill_text/after_sft --warm-target teacher_target --warm-steps 400 \\
        --seeds 3 --steps 150 --parallel 2
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

ROWS_PER_RL_STEP = 16 * 8  # text_opd: optim.prompts_per_step x algorithm.group_size
WARM_BATCH = 64  # warm_start.batch_size (every cell's)
CELLS = {  # name -> the cell's settings (text_opd distils beside the reward by default)
    "grpo": "algorithm.distill.teacher={}",
    "opd": "algorithm.distill.with_reward=false",
    "opd+grpo": "algorithm.distill.with_reward=true",
}


def teacher_samples(teacher: str, out: Path, overrides: list[str]) -> tuple[dict, int]:
    """Write OUT/train.jsonl (text_opd's rows, each with one teacher sample `teacher_target`) and
    OUT/eval.jsonl; return the mean prompt, target and teacher-sample lengths in tokens and the
    student's parameter count."""
    import torch

    from mmrl.config.parse import load_recipe
    from mmrl.core.policy import build_policy
    from mmrl.registry import DATASETS, RECIPES, load_plugins
    from mmrl.train.plan.teacher import teacher_policy_config
    load_plugins()
    cfg = load_recipe(RECIPES.get("text_opd"), [f"algorithm.distill.teacher.model={teacher}", *overrides])
    data = DATASETS.get(cfg.data.name)(**cfg.data.args)
    torch.manual_seed(0)
    policy = build_policy(cfg, teacher_policy_config(cfg))
    policy.model.eval()
    rows = data["train"]
    with torch.no_grad():
        for start in range(0, len(rows), 256):
            chunk = rows[start:start + 256]
            drawn = policy.rollout([r["prompt"] for r in chunk], 1, seeds=[start + i for i in range(len(chunk))])
            for row, completion in zip(chunk, drawn.completions):
                row["teacher_target"] = completion
    tokens = policy.tokenizer
    lengths = {key: sum(len(tokens(r[key])["input_ids"]) for r in rows) / len(rows)
               for key in ("prompt", "target", "teacher_target")}
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data["eval"]))
    student = build_policy(cfg)  # the recipe's own policy section: the student
    return lengths, sum(p.numel() for p in student.model.parameters())


def student_flops(params: int, lengths: dict, rl_steps: int, warm_steps: int, warm_target: str) -> dict[str, float]:
    """Student FLOPs (2 N per token forward, 6 N forward and backward) of an RL step (the completion
    generated, a no-grad pass for the old log-probs and the trained pass over prompt and completion),
    of a warm-start step and a supervised-distillation step (a trained pass over prompt and target),
    and the supervised steps that match the RL cells' warm start (`warm_steps` on `warm_target`) plus
    `rl_steps` RL steps."""
    prompt, completion, sampled = lengths["prompt"], lengths["target"], lengths["teacher_target"]
    rl = ROWS_PER_RL_STEP * params * (2 * completion + 2 * (prompt + completion) + 6 * (prompt + completion))
    warm = WARM_BATCH * params * 6 * (prompt + lengths[warm_target])
    sft = WARM_BATCH * params * 6 * (prompt + sampled)
    budget = warm_steps * warm + rl_steps * rl
    return {"rl_step": rl, "warm_step": warm, "warm_steps": warm_steps, "sft_step": sft, "budget": budget,
            "sft_steps": round(budget / sft)}


def run_sweep(args, out: Path, flops: dict) -> None:
    cells = [*CELLS.values(), f"max_steps=1 warm_start.steps={flops['sft_steps']} "  # its score: before RL
                              "warm_start.target_column=teacher_target"]
    command = [sys.executable, "-m", "mmrl", "sweep", "text_opd", "--seeds", str(args.seeds),
               "--parallel", str(args.parallel), "--out", str(out / "sweep"), "--held-out-reward", "accuracy",
               *[x for cell in cells for x in ("--cell", cell)],
               f"algorithm.distill.teacher.model={args.teacher}", "data.name=null",
               f"data.path={out / 'train.jsonl'}", f"data.eval_path={out / 'eval.jsonl'}",
               f"warm_start.steps={args.warm_steps}", f"warm_start.target_column={args.warm_target}",
               "warm_start.lr=2.0e-3", f"warm_start.batch_size={WARM_BATCH}",
               f"max_steps={args.steps}", f"eval.every={max(args.steps // 5, 1)}", "save_every=0", *args.overrides]
    subprocess.run(command, check=True)


def report(out: Path, flops: dict, steps: int) -> dict:
    """Per cell: held-out exact match (sampled and greedy) before and after, mean and standard error over
    seeds; the RL cells' periodic evaluations (`eval/reward/accuracy`) against student FLOPs; the figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [*CELLS, "sft on teacher samples"]
    runs = list(csv.DictReader(open(out / "sweep" / "sweep.csv")))
    summary, curves = {}, {}
    for index, name in enumerate(names):
        mine = [r for r in runs if int(r["cell"]) == index]
        if name in CELLS:
            keys = {"before": "before", "after": "after", "greedy_after": "greedy_after"}
        else:  # the supervised cell's result is its warm start's, scored before its one (unused) RL step
            keys = {"after": "before", "greedy_after": "greedy_before"}
        summary[name] = {key: mean_se([float(r[column]) for r in mine]) for key, column in keys.items()}
        summary[name]["runs"] = len(mine)
        by_step: dict[int, list[float]] = {}
        for run in mine:
            for line in open(out / "sweep" / run["run_dir"] / "metrics.jsonl"):
                row = json.loads(line)
                if "eval/reward/accuracy" in row:
                    by_step.setdefault(int(row["step"]), []).append(float(row["eval/reward/accuracy"]))
        curves[name] = {step: mean_se(v) for step, v in sorted(by_step.items()) if len(v) == len(mine)}
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in names:
        points = [(flops["warm_steps"] * flops["warm_step"] + step * flops["rl_step"], m, e)
                  for step, (m, e) in curves[name].items()] if name in CELLS else []
        start = summary[name]["before"] if name in CELLS else None
        if start is not None:
            points.insert(0, (flops["warm_steps"] * flops["warm_step"], *start))
        points.append((flops["budget"], *summary[name]["after"]))
        points = sorted(set(points))
        ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                    label=name, capsize=3)
    ax.set_xlabel("student FLOPs (2N per token forward, 6N forward + backward)")
    ax.set_ylabel("held-out exact match (sampled)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "distill.png", dpi=120)
    result = {"flops": flops, "rl_steps": steps, "cells": summary, "curves": curves}
    (out / "study.json").write_text(json.dumps(result, indent=1))
    return result


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, (var / n) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True, help="the teacher's model folder (a text demo checkpoint's model/)")
    parser.add_argument("--out", default="docs/results/distill_text", help="where the rows, the sweep and the figure go")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150, help="RL steps of each RL cell")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (mmrl sweep --parallel)")
    parser.add_argument("--warm-steps", type=int, default=100, help="the RL cells' supervised warm start")
    parser.add_argument("--warm-target", default="target", choices=["target", "teacher_target"],
                        help="what the RL cells' warm start learns: the data's targets or the teacher's samples")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="text_opd overrides for every run, e.g. the student's size: policy.tiny_args.layers=2")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lengths, params = teacher_samples(args.teacher, out, args.overrides)
    flops = {**student_flops(params, lengths, args.steps, args.warm_steps, args.warm_target),
             "student_params": params, "lengths": lengths}
    run_sweep(args, out, flops)
    print(json.dumps(report(out, flops, args.steps), indent=1))


if __name__ == "__main__":
    main()
