"""The demos' held-out inputs and outputs as files (`DEMO_SAMPLE_WRITERS`), so a run can be
inspected and re-scored: every PIL image (an input image, a generated image) as a PNG, every
mono audio clip ({"array", "sampling_rate"}) as a WAV file (32-bit float), every video clip
({"frames": [T, H, W, 3] uint8, "fps"}) as one PNG per frame, and ``samples.json`` with, per held-out prompt, its data
columns, the sampled completions and the greedy one (with the greedy rollout's own columns: a composite's
`thought`), their rewards and evaluator values, each
medium replaced by its file names (a clip: {"frames": [PNG names], "fps"}; audio: {"wav": name,
"sampling_rate"}). Other values that are not JSON are written as their type's name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def _is_image(value: Any) -> bool:
    return hasattr(value, "convert") and hasattr(value, "save") and hasattr(value, "size")


def _is_audio(value: Any) -> bool:
    return isinstance(value, dict) and {"array", "sampling_rate"} <= set(value) and np.ndim(value["array"]) == 1


def _is_clip(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("frames"), np.ndarray) and value["frames"].ndim == 4
            and value["frames"].dtype == np.uint8)


def write_samples(samples: list[dict], folder: Path) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def keep(value: Any, stem: str) -> Any:
        if _is_image(value):
            value.convert("RGB").save(folder / f"{stem}.png")
            return f"{stem}.png"
        if _is_audio(value):
            import soundfile
            rate = int(value["sampling_rate"])
            soundfile.write(folder / f"{stem}.wav", np.asarray(value["array"], dtype=np.float32), rate, subtype="FLOAT")
            return {"wav": f"{stem}.wav", "sampling_rate": rate}
        if _is_clip(value):
            from PIL import Image
            names = []
            for t, frame in enumerate(value["frames"]):
                Image.fromarray(frame).save(folder / f"{stem}_frame{t:02d}.png")
                names.append(f"{stem}_frame{t:02d}.png")
            return {**{k: keep(v, f"{stem}_{k}") for k, v in value.items() if k != "frames"}, "frames": names}
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
                        "greedy_reward": sample["greedy_reward"], "greedy_eval": sample["greedy_eval"],
                        "greedy_columns": keep(sample.get("greedy_columns") or {}, f"{i:03d}_greedy")})
    (folder / "samples.json").write_text(json.dumps(records, indent=1))
