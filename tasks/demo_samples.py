"""The demos' held-out inputs and outputs as files (`DEMO_SAMPLE_WRITERS`), so a run can be
inspected and re-scored: every PIL image (an input image, a generated image) as a PNG, and
``samples.json`` with, per held-out prompt, its data columns, the sampled completions and the
greedy one, their rewards and evaluator values, each image replaced by its PNG's file name.
Values that are neither JSON nor images (e.g. audio arrays) are written as their type's name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _is_image(value: Any) -> bool:
    return hasattr(value, "convert") and hasattr(value, "save") and hasattr(value, "size")


def write_samples(samples: list[dict], folder: Path) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def keep(value: Any, stem: str) -> Any:
        if _is_image(value):
            value.convert("RGB").save(folder / f"{stem}.png")
            return f"{stem}.png"
        if isinstance(value, dict):
            return {k: keep(v, f"{stem}_{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [keep(v, f"{stem}_{j}") for j, v in enumerate(value)]
        if value is None or isinstance(value, (str, int, float, bool)):
            return value
        return f"<{type(value).__name__}>"

    records = []
    for i, sample in enumerate(samples):
        records.append({"row": keep(sample["row"], f"{i:03d}_input"),
                        "completions": [keep(c, f"{i:03d}_sample{j}") for j, c in enumerate(sample["completions"])],
                        "rewards": sample["rewards"], "eval": sample["eval"],
                        "greedy": keep(sample["greedy"], f"{i:03d}_greedy"),
                        "greedy_reward": sample["greedy_reward"], "greedy_eval": sample["greedy_eval"]})
    (folder / "samples.json").write_text(json.dumps(records, indent=1))
