"""A scored benchmark's files in ``OUT/bench/NAME/``: ``scores.jsonl`` (each sample's prompt,
completion and metric values), ``summary.json`` (the headline figure and every figure with its
standard error, overall and per category, and what produced them) and ``report.md`` (the figures
and a sample grid: ``grid.png`` of the first images or video frames, or for text a table of
examples)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from mmrl.core.bench_stats import bench_figures
from mmrl.core.benchmark import Benchmark

GRID_SAMPLES, TABLE_SAMPLES, CELL_CHARS = 16, 8, 160


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 3] + "..."


def _figure(f: dict) -> str:
    return "nan" if math.isnan(f["value"]) else f"{f['value']:.4g} ± {f['se']:.2g} (n={f['n']})"


def _grid(samples: list[dict], path: Path) -> bool:
    """The first images (or first video frames) in a square grid; False when no sample is one."""
    import numpy as np
    from PIL import Image
    tiles = []
    for s in samples:
        c = s["completion"]
        if isinstance(c, np.ndarray) and c.ndim == 4:
            tiles.append(Image.fromarray(c[0]))
        elif hasattr(c, "convert"):
            tiles.append(c.convert("RGB"))
        if len(tiles) == GRID_SAMPLES:
            break
    if not tiles:
        return False
    side = max(t.size[0] for t in tiles)
    cols = math.ceil(math.sqrt(len(tiles)))
    grid = Image.new("RGB", (cols * side, math.ceil(len(tiles) / cols) * side), "white")
    for i, tile in enumerate(tiles):
        grid.paste(tile.resize((side, side)), ((i % cols) * side, (i // cols) * side))
    grid.save(path)
    return True


def _report(bench: Benchmark, summary: dict, scored: list[dict], samples: list[dict], folder: Path) -> str:
    head = summary["headline"]
    lines = [f"# {bench.name}: {head['figure']} {_figure(head)}", "", bench.description, "",
             f"model: {summary['model']}; {summary['num_prompts']} of {summary['source_prompts']} prompts"
             f"{' (SMOKE SUBSET: not the benchmark figure)' if summary['smoke_subset'] else ''}, "
             f"{summary['samples_per_prompt']} sample(s) each, {'greedy' if summary['greedy'] else 'sampled'}; "
             f"source {summary['source']} ({summary['split']})", "", f"official: {bench.official}", "",
             "| figure | value ± standard error (prompts) |", "|---|---|"]
    lines += [f"| {name} | {_figure(f)} |" for name, f in summary["figures"].items()]
    for column, groups in summary["categories"].items():
        lines += ["", f"## per {column}", "", f"| {column} | " + " | ".join(bench.figures) + " |",
                  "|---|" + "---|" * len(bench.figures)]
        lines += [f"| {value} | " + " | ".join(_figure(t[f]) for f in bench.figures) + " |" for value, t in groups.items()]
    lines += ["", "## samples", ""]
    if _grid(samples, folder / "grid.png"):
        lines.append(f"![the first {min(len(samples), GRID_SAMPLES)} samples](grid.png)")
    else:
        lines += ["| id | prompt | completion | " + " | ".join(bench.metrics) + " |", "|---|---|---|" + "---|" * len(bench.metrics)]
        for s, v in list(zip(samples, scored))[:TABLE_SAMPLES]:
            lines.append(f"| {s['id']} | {_cell(s['prompt'])} | {_cell(s['completion'])} | "
                         + " | ".join(_cell(v["values"][m]) for m in bench.metrics) + " |")
    return "\n".join(lines) + "\n"


def write_results(folder: Path, bench: Benchmark, info: dict, scored: list[dict], samples: list[dict]) -> dict:
    """Write scores.jsonl, summary.json and report.md (module docstring); return the summary."""
    summary = {**info, **bench_figures(bench, scored)}
    with open(folder / "scores.jsonl", "w") as f:
        for s, v in zip(samples, scored):
            completion = s["completion"] if isinstance(s["completion"], str) else f"<{type(s['completion']).__name__}>"
            f.write(json.dumps({**v, "prompt": s["prompt"], "completion": completion}, default=str) + "\n")
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    (folder / "report.md").write_text(_report(bench, summary, scored, samples, folder))
    return summary
