"""What users see of a run: a progress bar, ``metrics.jsonl``, TensorBoard, W&B when asked,
and ``plots/rewards.png`` redrawn as training goes."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

REPORTERS = ("tensorboard", "wandb", "none")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _save_figure_atomically(fig, out_png: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_png.with_name(f".{out_png.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, out_png)


def _moving_average(values: list[float], width: int) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > width:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def plot_rewards(metrics_path: str | Path, out_png: str | Path) -> bool:
    """Reward curves (raw and moving average) and, when logged, KL and clip fraction."""
    from matplotlib.figure import Figure
    records = read_metrics(metrics_path)
    keys = [k for k in ("reward_mean",) if any(k in r for r in records)]
    keys += sorted({k for r in records for k in r if k.startswith("reward/")})
    if not records or not keys:
        return False
    extra = [k for k in ("kl", "clip_frac") if any(r.get(k) is not None for r in records)]
    fig = Figure(figsize=(8, 6 if extra else 4))
    axes = fig.subplots(2 if extra else 1, 1, squeeze=False)[:, 0]
    width = max(1, len(records) // 10)
    for key in keys:
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if not pts:
            continue
        steps, values = zip(*pts)
        line, = axes[0].plot(steps, values, linewidth=0.7, alpha=0.4)
        axes[0].plot(steps, _moving_average(list(values), width), linewidth=2, color=line.get_color(), label=key)
    axes[0].set_title("rewards")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("reward")
    axes[0].legend(fontsize=8)
    if extra:
        for key in extra:
            pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            steps, values = zip(*pts)
            axes[1].plot(steps, values, label=key)
        axes[1].set_xlabel("step")
        axes[1].legend(fontsize=8)
    fig.tight_layout()
    _save_figure_atomically(fig, Path(out_png))
    return True


def plot_sample_grid(images: Sequence[Any], captions: Sequence[str], out_png: str | Path, ncols: int = 4) -> None:
    """A PNG grid of PIL images or HxWxC uint8 arrays, each with a short caption."""
    import numpy as np
    from matplotlib.figure import Figure
    n = len(images)
    ncols = max(1, min(ncols, n))
    nrows = max(1, math.ceil(n / ncols))
    fig = Figure(figsize=(2.5 * ncols, 2.8 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < n:
            ax.imshow(np.asarray(images[i]))
            ax.set_title(str(captions[i])[:40], fontsize=7)
    fig.tight_layout()
    _save_figure_atomically(fig, Path(out_png))


class Tracker:
    """metrics.jsonl + TensorBoard (+ W&B) + reward plot; a no-op where `enabled` is False."""

    def __init__(self, output_dir: str | Path, report_to: Sequence[str] = ("tensorboard",), plot_every: int = 10,
                 config: dict | None = None, resume_step: int | None = None, enabled: bool = True):
        for r in report_to:
            if r not in REPORTERS:
                raise ValueError(f"logging.report_to: {r!r} is not one of {list(REPORTERS)}")
        self.enabled = enabled
        self.plot_every = plot_every
        self.dir = Path(output_dir)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.plot_path = self.dir / "plots" / "rewards.png"
        self.writer = None
        self.wandb = None
        if not enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if config is not None:
            (self.dir / "config.json").write_text(json.dumps(config, indent=1, default=str))
        if resume_step is not None:
            kept = [r for r in read_metrics(self.metrics_path) if r.get("step", 0) <= resume_step]
            tmp = self.metrics_path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
            os.replace(tmp, self.metrics_path)
        self._file = open(self.metrics_path, "a")
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(self.dir / "tensorboard"))
        if "wandb" in report_to:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("logging.report_to includes 'wandb' but it is not installed: "
                                  "pip install wandb") from e
            self.wandb = wandb.init(project="mmrl", config=config, dir=str(self.dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {k: _clean(v) for k, v in metrics.items()}
        record["step"] = step
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        if self.writer is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self.writer.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.plot_every and step % self.plot_every == 0:
            plot_rewards(self.metrics_path, self.plot_path)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        plot_rewards(self.metrics_path, self.plot_path)
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


class Progress:
    """A tqdm bar over training steps with reward, KL and clip fraction; tqdm gives the ETA."""

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, desc: str = "train"):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)

    def update(self, step: int, metrics: dict) -> None:
        if self.bar is None:
            return
        self.bar.update(step - self.bar.n)
        shown = {"reward": "reward_mean", "kl": "kl", "clip": "clip_frac", "loss": "loss"}
        self.bar.set_postfix({k: f"{metrics[v]:.3g}" for k, v in shown.items()
                              if isinstance(metrics.get(v), (int, float))}, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
