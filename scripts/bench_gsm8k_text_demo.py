"""`mmrl bench gsm8k` on the text demo: its base model and its trained checkpoint, scored by GSM8K's
protocol (lm-eval's answer extraction and exact match, greedy) on a GSM8K-style copy of the demo's
own held-out prompts ("sort:3816=", the answer "... #### 1368"), beside the demo's own greedy
exact-match evaluator on the same prompts, which the GSM8K figure should match up to its extraction.

What the figure is: the GSM8K protocol run on a sorting task the tiny model can learn, so the
harness, the protocol and the checkpoint loading are exercised end to end on a real training run; it
is not a GSM8K score (the model has never seen a word problem).

    python scripts/bench_gsm8k_text_demo.py [--out DIR] [--run DIR] [--json PATH] [key=value ...]

--run reuses a finished `mmrl demo text` output directory; otherwise the demo runs first (its
overrides after the options). Prints JSON: each model's flexible-extract and strict-match accuracy
with standard errors, the difference, and the demo's evaluator.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def mmrl(*args: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "mmrl", *args], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"mmrl {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def fixture(run: Path, path: Path) -> int:
    """The demo's held-out rows (its data set's eval split, as the run's config has it) in GSM8K's format."""
    from mmrl.registry import DATASETS
    config = json.loads((run / "config.json").read_text())
    rows = DATASETS.get(config["data"]["name"])(**config["data"]["args"])["eval"][: config["eval"]["max_prompts"]]
    path.write_text("".join(json.dumps({"question": r["prompt"], "answer": f"Sort the digits.\n#### {r['answer']}"}) + "\n"
                            for r in rows))
    return len(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="outputs/bench_gsm8k_text_demo")
    p.add_argument("--run", help="a finished `mmrl demo text` output directory (default: run the demo in OUT/run)")
    p.add_argument("--json", help="also write the report here")
    args, overrides = p.parse_known_args()
    out = Path(args.out)
    run = Path(args.run) if args.run else out / "run"
    if not args.run:
        mmrl("demo", "text", f"output_dir={run}", "logging.progress=false", *overrides)
    data = out / "gsm8k_style_sorting.jsonl"
    prompts = fixture(run, data)
    final = sorted((run / "checkpoints").glob("step-*"))[-1]
    common = ["--data", str(data), "--option", "template={question}", "policy.max_new_tokens=24"]
    mmrl("bench", "gsm8k", "--checkpoint", str(final), "--out", str(out / "checkpoint"), *common)
    mmrl("bench", "gsm8k", "text_demo", f"output_dir={run}", "--base", "--out", str(out / "base"), *common)
    report = {"prompts": prompts, "checkpoint_dir": str(final)}
    for name in ("base", "checkpoint"):
        summary = json.loads((out / name / "bench" / "gsm8k" / "summary.json").read_text())
        report[name] = {k: summary["figures"][k] for k in ("flexible_extract", "strict_match")}
    report["difference"] = report["checkpoint"]["flexible_extract"]["value"] - report["base"]["flexible_extract"]["value"]
    demo = run / "summary.json"
    if demo.is_file():
        after = json.loads(demo.read_text())
        report["demo_greedy_exact_match_after"] = 100 * after.get("greedy_eval_after", float("nan"))
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
