"""`mmrl bench`: one benchmark on one model, in two stages that can run apart.

``generate``: the rows of this shard (``--shard i/n``: rows i, i + n, ...), sample k of each drawn
from the seed of (prompt id, k), written to ``OUT/bench/NAME/shards/I-of-N/`` (sample_files.py); a
finished shard is skipped. ``score``: every shard of n finished, their samples read back (media from
their files), scored by the benchmark's scorer (in process or at ``--scorer-url``), the figures and
their standard errors written (report.py). ``all`` (the default) generates, then scores once every
shard of n is finished. Scores of the shards together equal the unsharded run's: each sample depends
on its prompt and index alone, and the scoring reads the samples in the rows' order.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl.config.sections import TrainConfig
from mmrl.core.benchmark import Benchmark
from mmrl.data.bench_rows import benchmark_rows, shard_rows
from mmrl.errors import UserError
from mmrl.experiments.bench.policy_source import check_media, generation_settings, load_policy
from mmrl.experiments.bench.report import write_results
from mmrl.experiments.bench.sample_files import DONE, finished, mark_finished, read_samples, sample_record, shard_dir
from mmrl.registry import BENCHMARKS
from mmrl.train.loop.benchmark_pass import generate_samples, score_samples
from mmrl.train.placement.bench_scoring import bench_metric_fns

STAGES = ("all", "generate", "score")


@dataclass
class BenchRun:
    """What `mmrl bench` was asked (mmrl/cli/commands.py builds it). `cfg`: the policy's config with the
    protocol's settings applied (policy_source.protocol_config); `label`: what is benchmarked."""

    name: str
    out: Path
    cfg: TrainConfig | None
    label: str
    checkpoint: Path | None = None
    stage: str = "all"
    shard: tuple[int, int] = (0, 1)
    num_prompts: int | None = None
    data: str | None = None
    split: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    scorer_url: str | None = None
    seed: int = 0
    prompts_per_call: int = 16

    @property
    def folder(self) -> Path:
        return self.out / "bench" / self.name


def _say(text: str) -> None:
    print(f"[mmrl bench] {text}", file=sys.stderr, flush=True)


def _generate(run: BenchRun, bench: Benchmark, rows: list[dict], options: dict, meta: dict) -> None:
    """This shard's samples written to its folder, unless it is finished already."""
    folder = shard_dir(run.folder, run.shard)
    if finished(folder, meta):
        _say(f"shard {run.shard[0]}/{run.shard[1]} is finished already ({folder}): skipped")
        return
    if run.cfg is None:
        raise UserError("mmrl bench --stage generate needs a model: --checkpoint DIR, --model ID or --base")
    mine = shard_rows(rows, run.shard)
    check_media(run.cfg, mine, f"benchmark {bench.name}: {run.data or bench.source}")
    policy = load_policy(run.cfg, run.checkpoint)
    resolved = bench.resolve_options(options, policy) if bench.resolve_options else options
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(folder / "samples.jsonl", "w") as lines:
        def write(new: list[dict]) -> None:
            nonlocal written
            for sample in new:
                lines.write(json.dumps(sample_record(sample, folder, policy.sample_medium)) + "\n")
            lines.flush()
            written += len(new)
            _say(f"shard {run.shard[0]}/{run.shard[1]}: {written} of {len(mine) * bench.samples} samples")
        generate_samples(policy, bench, mine, resolved, run.seed, bench.samples, bench.greedy,
                         run.prompts_per_call, on_call=write)
    (folder / "generation.json").write_text(json.dumps(
        {"model": run.label, "checkpoint": str(run.checkpoint) if run.checkpoint else None, "task": run.cfg.task,
         "options": resolved, "policy": generation_settings(bench, run.cfg)}, indent=1))
    mark_finished(folder, meta, written)


def _missing_shards(run: BenchRun) -> list[int]:
    n = run.shard[1]
    return [i for i in range(n) if not (shard_dir(run.folder, (i, n)) / DONE).is_file()]


def _score(run: BenchRun, bench: Benchmark, rows: list[dict], total: int, meta: dict) -> dict:
    """Every shard's samples scored and summarised (their rows' order, then sample index)."""
    n = run.shard[1]
    samples, generation = [], None
    for i in range(n):
        folder = shard_dir(run.folder, (i, n))
        finished(folder, meta)  # refuses a shard generated with other settings
        samples += read_samples(folder)
        generation = generation or json.loads((folder / "generation.json").read_text())
    order = {row["id"]: j for j, row in enumerate(rows)}
    samples.sort(key=lambda s: (order[s["id"]], s["k"]))
    by_id = {row["id"]: {**row, **generation["options"]} for row in rows}
    scored = score_samples(bench, bench_metric_fns(bench, run.scorer_url), samples, by_id)
    info = {"benchmark": bench.name, "description": bench.description, "model": generation["model"],
            "checkpoint": generation["checkpoint"], "source": run.data or bench.source,
            "split": run.split or (None if run.data else bench.split), "smoke_subset": run.num_prompts is not None and len(rows) < total,
            "num_prompts": len(rows), "source_prompts": total, "samples_per_prompt": bench.samples,
            "greedy": bench.greedy, "seed": run.seed, "shards": n, "generation": generation,
            "scorer": {"reward": bench.scorer, "url": run.scorer_url, "metrics": {k: dict(v) for k, v in bench.metrics.items()}},
            "official": bench.official}
    return write_results(run.folder, bench, info, scored, samples)


def run_bench(run: BenchRun) -> dict | None:
    """The stages `run.stage` asks for (the module docstring); the summary when scored, else None."""
    if run.stage not in STAGES:
        raise UserError(f"--stage {run.stage!r}: one of {', '.join(STAGES)}")
    bench: Benchmark = BENCHMARKS.get(run.name)
    try:
        options = bench.with_options(run.options)
    except ValueError as e:
        raise UserError(f"--option: {e}") from None
    rows, total = benchmark_rows(bench, options, run.data, run.split, run.num_prompts)  # before any model loads
    meta = {"benchmark": bench.name, "options": options, "seed": run.seed,
            "prompts": [row["id"] for row in rows], "source": run.data or bench.source, "split": run.split or bench.split}
    if run.stage in ("all", "generate"):
        _generate(run, bench, rows, options, meta)
    if run.stage == "generate":
        return None
    missing = _missing_shards(run)
    if missing:
        if run.stage == "all":
            _say(f"{run.shard[1] - len(missing)} of {run.shard[1]} shards finished; scoring waits for shards "
                 f"{missing} (then: mmrl bench {run.name} --stage score --shard 0/{run.shard[1]} ...)")
            return None
        raise UserError(f"mmrl bench --stage score: shards {missing} of {run.shard[1]} are not finished in {run.folder}")
    summary = _score(run, bench, rows, total, meta)
    _say(f"{bench.name}: {summary['headline']['figure']} {summary['headline']['value']:.4g} "
         f"(se {summary['headline']['se']:.2g}, n={summary['headline']['n']}); {run.folder / 'summary.json'}")
    return summary
