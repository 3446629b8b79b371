"""One GRPO step of mmrl on a vision-language model, split into rollout, log-prob and update,
against TRL's GRPOTrainer and the bare work, in one run.

Same tiny Qwen2.5-VL (the grounding recipe's, with 448 x 448 images by default: 256 visual tokens each),
same synthetic shapes images and questions, G completions of exactly T tokens (eos suppressed),
beta 0, one optimizer step per rollout batch, 2 CPU threads. The bare work is plain `generate`
(every group member prefilled with its image) + a forward/backward of the same tokens with a
log-softmax policy-gradient loss + an AdamW step. mmrl's steps alternate between its shared
prefill (each prompt and image prefilled once, the KV cache repeated for the group: the default)
and the plain prefill (`policy.shared_prefill=false`), which give the same samples.

    python scripts/bench_vlm.py --json bench_vlm.json

prints and writes {"trl_time_ratio": mmrl / TRL, "trl_time_ratio_no_share": ...,
"rollout_speedup": plain prefill / shared prefill, "split_s": {...}, ...}. Phases: rollout =
sampling + rewards + advantages (TRL: `_generate_and_score_completions`), log-prob = the forward
passes that compute token log-probs (TRL: `_get_per_token_logps_and_entropies`), update = the
rest of the step (backward, optimizer). Step times are taken relative to bare steps interleaved
in the same process (`bench_harness.py`). TRL is needed only here (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time

from bench_harness import (
    Comparison,
    PhaseTimer,
    add_contender_options,
    add_worker_options,
    compare,
    contenders,
    digit_share,
    group_advantages,
    mmrl_recipe,
    over_bare,
    policy_gradient_update,
    require_trl,
    timed_steps,
    trl_grpo_config,
    trl_step_timer,
    worker,
)
from bench_report import emit

SIZE = 448  # default image side in pixels: (448 / 14)^2 patches, merged 2 x 2 -> 256 visual tokens
MERGED_PATCH = 28  # pixels per visual token side: 14-pixel patches merged 2 x 2
MODEL = {"hidden": 128, "layers": 2, "heads": 4, "vision_hidden": 64, "rope_theta": 10.0, "seed": 0}
PHASES = ("rollout", "logprob", "update")


def model_args(size: int) -> dict:
    """MODEL with its processor taking `size` x `size` images whole."""
    return {**MODEL, "max_pixels": size * size}


def shape_data(n: int, size: int) -> list[dict]:
    from mmrl.tasks.demos.synthetic.shapes import shape_rows
    return shape_rows(n, size, 2, random.Random(0))


def messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]


class BareVLMStep:
    """Plain `generate` + forward/backward of the same tokens + AdamW step, on a model of its own."""

    def __init__(self, args):
        import torch
        from mmrl.tasks.demos.tiny_multimodal import qwen25_vl_char
        self.args = args
        self.model, self.processor = qwen25_vl_char(**model_args(args.image_size))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5, fused=True)
        rows = shape_data(args.prompts, args.image_size)
        texts = [self.processor.apply_chat_template(messages(r["prompt"]), tokenize=False, add_generation_prompt=True)
                 for r in rows]
        enc = self.processor(text=texts, images=[r["image"] for r in rows], padding=True, return_tensors="pt")
        g = args.group
        patches = enc["pixel_values"].shape[0] // len(rows)  # every image has the same size
        self.inputs = {
            "input_ids": enc["input_ids"].repeat_interleave(g, 0),
            "attention_mask": enc["attention_mask"].repeat_interleave(g, 0),
            "mm_token_type_ids": enc["mm_token_type_ids"].repeat_interleave(g, 0),
            "pixel_values": enc["pixel_values"].view(len(rows), patches, -1).repeat_interleave(g, 0).flatten(0, 1),
            "image_grid_thw": enc["image_grid_thw"].repeat_interleave(g, 0),
        }
        self.suppress = [self.model.config.image_token_id, self.model.config.video_token_id,
                         self.model.config.vision_start_token_id, self.model.config.vision_end_token_id]

    def __call__(self) -> float:
        import torch
        args, model, inputs = self.args, self.model, self.inputs
        tok = self.processor.tokenizer
        width = inputs["input_ids"].shape[1]
        t0 = time.perf_counter()
        with torch.no_grad():
            seq = model.generate(**inputs, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=args.tokens,
                                 min_new_tokens=args.tokens, pad_token_id=tok.pad_token_id,
                                 suppress_tokens=self.suppress)
        completion = seq[:, width:]
        adv = group_advantages(tok.batch_decode(completion, skip_special_tokens=True), args.group)
        mask = torch.cat([inputs["attention_mask"], torch.ones_like(completion)], 1)
        types = torch.nn.functional.pad(inputs["mm_token_type_ids"], (0, completion.shape[1]))
        logits = model(input_ids=seq, attention_mask=mask, mm_token_type_ids=types,
                       pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]).logits
        policy_gradient_update(self.opt, logits[:, width - 1:-1], completion, adv)
        return time.perf_counter() - t0


def _data_file(args) -> str:
    """The benchmark's rows as JSONL, images as PNG files beside it."""
    folder = tempfile.mkdtemp(prefix="mmrl-bench-vlm-")
    path = os.path.join(folder, "rows.jsonl")
    with open(path, "w") as f:
        for i, row in enumerate(shape_data(args.prompts * 4, args.image_size)):
            image = os.path.join(folder, f"{i}.png")
            row["image"].save(image)
            f.write(json.dumps({"prompt": row["prompt"], "image": image}) + "\n")
    return path


def run_mmrl(args, bare: BareVLMStep | None) -> tuple[list[float], list[float], list[dict]]:
    """Steps alternate between the shared prefill and the plain one (same samples either way)."""
    from mmrl.config.parse import parse_config
    from mmrl.train.loop.trainer import Trainer
    recipe = mmrl_recipe(args, "vlm", {"model": "tiny:qwen2.5-vl-char", "tiny_args": model_args(args.image_size),
                                       "max_new_tokens": args.tokens, "min_new_tokens": args.tokens,
                                       "temperature": 1.0},
                         {"path": _data_file(args)})
    trainer = Trainer(parse_config(recipe))
    phases = PhaseTimer()
    phases.wrap(trainer, "prepare_batch", "rollout")
    phases.wrap(trainer.policy, "logprobs", "logprob")
    count = iter(range(10 ** 9))

    def step() -> dict:
        shared = next(count) % 2 == 0
        trainer.policy.cfg.shared_prefill = shared
        phases.take()
        trainer.train_step()
        return {"shared_prefill": shared, **phases.take()}

    return timed_steps(step, args.warmup, args.steps, bare)


def run_trl(args, bare: BareVLMStep | None) -> tuple[list[float], list[float], list[dict]]:
    from datasets import Dataset
    from mmrl.tasks.demos.tiny_multimodal import qwen25_vl_char
    from trl import GRPOTrainer
    model, processor = qwen25_vl_char(**model_args(args.image_size))
    rows = shape_data(args.prompts * 4, args.image_size)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "image": r["image"]}
                              for r in rows] * (args.warmup + args.steps + 1))
    times: list[float] = []
    floor: list[float] = []
    split: list[dict] = []
    phases = PhaseTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=digit_share, args=trl_grpo_config(args), train_dataset=data,
                          processing_class=processor,
                          callbacks=[trl_step_timer(args.warmup, times, floor, bare, phases, split)])
    phases.wrap(trainer, "_generate_and_score_completions", "rollout")
    phases.wrap(trainer, "_get_per_token_logps_and_entropies", "logprob")
    trainer.train()
    return times, floor, split


def visual_tokens(size: int) -> int:
    """Visual tokens the processor makes of one `size` x `size` image."""
    from mmrl.tasks.demos.tiny_multimodal import qwen25_vl_char
    _, processor = qwen25_vl_char(**model_args(size))
    grid = processor.image_processor(images=[shape_data(1, size)[0]["image"]], return_tensors="pt")["image_grid_thw"]
    return int(grid.prod()) // processor.image_processor.merge_size ** 2


def split_of(times: list[float], extra: list[dict], keep) -> tuple[list[float], dict[str, float]]:
    """The step times of the steps `keep` selects, and their median phase times (update = the
    step's time outside rollout and log-prob)."""
    rows = [(t, e) for t, e in zip(times, extra) if keep(e)]
    phase = {p: statistics.median(e.get(p, 0.0) for _, e in rows) for p in ("rollout", "logprob")}
    phase["update"] = statistics.median(t - e.get("rollout", 0.0) - e.get("logprob", 0.0) for t, e in rows)
    return [t for t, _ in rows], phase


def summary(args, tokens: int, measured: Comparison) -> dict:
    """The report: mmrl's step time (shared prefill and plain) and its phases over the bare steps
    beside it, against TRL's where TRL ran (the median over rounds, and each round's), peak RSS
    where measured."""
    rss, per_step, floor, extra = measured.rss, measured.pooled("times"), measured.pooled("floor"), measured.pooled("extra")
    shared_times, shared_split = split_of(per_step["mmrl"], extra["mmrl"], lambda e: e["shared_prefill"])
    plain_times, plain_split = split_of(per_step["mmrl"], extra["mmrl"], lambda e: not e["shared_prefill"])
    bare = {name: statistics.median(v) for name, v in floor.items()}
    split = {"mmrl": shared_split, "mmrl_no_share": plain_split}
    median_step = {"mmrl": statistics.median(shared_times), "mmrl_no_share": statistics.median(plain_times)}
    report: dict = {"rollout_speedup": plain_split["rollout"] / shared_split["rollout"],
                    "overhead_ratio": over_bare(shared_times, floor["mmrl"])}
    if args.trl:
        trl_times, split["trl"] = split_of(per_step["trl"], extra["trl"], lambda e: True)
        median_step["trl"] = statistics.median(trl_times)
        trl_ratio = over_bare(trl_times, floor["trl"])
        runs = measured.per_round(lambda r: over_bare(split_of(r["mmrl"]["times"], r["mmrl"]["extra"],
                                                                lambda e: e["shared_prefill"])[0], r["mmrl"]["floor"])
                                  / over_bare(r["trl"]["times"], r["trl"]["floor"]))
        report.update({
            "trl_time_ratio": runs["median"], "runs": {"trl_time_ratio": runs},
            "trl_time_ratio_no_share": over_bare(plain_times, floor["mmrl"]) / trl_ratio,
            "trl_phase_ratio": {p: (shared_split[p] / bare["mmrl"]) / (split["trl"][p] / bare["trl"]) for p in PHASES},
            "trl_overhead_ratio": trl_ratio,
            **({"trl_peak_rss_ratio": rss["mmrl"] / rss["trl"]} if rss else {})})
    return {
        **report, **({"peak_rss_mb": rss} if rss else {}),
        "split_s": split, "median_step_s": median_step, "load_average": measured.load_average,
        "median_bare_step_s": {f"beside_{name}": v for name, v in bare.items()},
        "setup": {"group": args.group, "prompts": args.prompts, "completion_tokens": args.tokens,
                  "visual_tokens_per_image": tokens, "threads": args.threads,
                  "rounds": args.rounds, "timed_steps": args.steps * args.rounds,
                  "model": model_args(args.image_size)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the result here too")
    parser.add_argument("--steps", type=int, default=8,
                        help="timed steps per process (mmrl: half of them shared; at least 2)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--prompts", type=int, default=2, help="images and questions per step")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per completion (T)")
    parser.add_argument("--image-size", type=int, default=SIZE,
                        help=f"image side in pixels, a multiple of {MERGED_PATCH} (the default: 256 visual tokens)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each process")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of fresh processes (the report gives the median and range over them)")
    add_contender_options(parser)
    add_worker_options(parser)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args, BareVLMStep, {"mmrl": run_mmrl, "trl": run_trl})))
        return
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: mmrl's steps alternate shared and plain prefill, so at least 2")
    require_trl(args.trl)
    tokens, expected = visual_tokens(args.image_size), (args.image_size // MERGED_PATCH) ** 2
    if tokens != expected:
        raise SystemExit(f"{tokens} visual tokens per {args.image_size}-pixel image, expected {expected}: "
                         f"the processor resized the image (--image-size must be a multiple of {MERGED_PATCH})")
    options = {k: getattr(args, k) for k in ("steps", "warmup", "group", "prompts", "tokens", "image_size", "threads")}
    emit(summary(args, tokens, compare(__file__, options, args.threads, args.rounds, *contenders(args))), args.json)


if __name__ == "__main__":
    main()
